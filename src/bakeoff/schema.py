"""The strict base of every user-written section, and its errors turned into lines a user can act on.

``Strict`` rejects unknown keys (a typo fails loudly instead of being ignored).
:func:`format_validation_error` renders a YAML file's pydantic errors as
``source: field.path: message``; :func:`flag_errors` renders the same errors for a command
line, naming the option instead of the field it fills. Both go through one cleaner of
pydantic's own wording, so a campaign file and a command line read alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import get_args

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """Base model: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold, through Annotated, list, dict and unions."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found += [m for m in _models_in(arg) if m not in found]
    return found


def section_model(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the section at ``loc`` (a pydantic error location), when it is one model.

    List indexes are stepped over; a workload kind in the location (how pydantic names
    the member of a discriminated union) picks that member.
    """
    candidates: list[type[BaseModel]] = [root]
    for part in loc:
        if isinstance(part, int):
            continue
        holders = [c for c in candidates if part in c.model_fields]
        if holders:
            candidates = _models_in(holders[0].model_fields[part].annotation)
        else:
            candidates = [c for c in candidates if "kind" in c.model_fields and c.model_fields["kind"].default == part]
        if not candidates:
            return None
    return candidates[0] if len(candidates) == 1 else None


def _plain(message: str) -> str:
    """Pydantic's own wording out: class names users never wrote, and its 'Value error, ' prefix."""
    message = re.sub(r"^(Value error|Assertion failed), ", "", message)
    return re.sub(r"Input should be a valid dictionary or instance of \w+", "expected a mapping (key: value)", message)


def format_validation_error(
    source: str,
    err: ValidationError,
    root: type[BaseModel] | None = None,
    hints: Mapping[str, str] | None = None,
) -> str:
    """Render pydantic errors as 'source: field.path: message' lines a user can act on.

    An unknown key lists the valid keys of its section (``root`` is the model validated);
    ``hints`` adds a section's accepted forms to a wrong-type error there (keyed by field name).
    """
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"]) or "(top level)"
        msg = _plain(item["msg"])
        if item["type"] == "extra_forbidden":
            section = section_model(root, tuple(item["loc"][:-1])) if root is not None else None
            valid = f"; valid keys here: {', '.join(section.model_fields)}" if section is not None else ""
            msg = f"unknown key; remove it or check its spelling{valid}"
        elif item["type"] in ("model_type", "model_attributes_type", "dict_type") and hints and item["loc"]:
            hint = hints.get(str(item["loc"][-1]))
            msg = f"{msg}; {hint}" if hint else msg
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def flag_errors(err: ValidationError, flag_of: Callable[[tuple[int | str, ...]], str]) -> str:
    """A command line's pydantic errors as '--flag: message' parts, joined by '; '.

    ``flag_of`` names the option that fills a field location; the wording is cleaned as in
    :func:`format_validation_error`, so a flag and a YAML key get the same message.
    """
    return "; ".join(f"{flag_of(tuple(item['loc']))}: {_plain(item['msg'])}" for item in err.errors())
