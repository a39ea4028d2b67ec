"""One problem ``bakeoff doctor`` found: the field, what the framework would have done, the fix, on one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """``field``: where to change it; ``would``: what the framework or runtime would have done; ``fix``."""

    field: str
    would: str
    fix: str
    severity: Severity = "error"

    def line(self) -> str:
        mark = "" if self.severity == "error" else "warning: "
        return f"{mark}{self.field}: {self.would}; fix: {self.fix}"


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]
