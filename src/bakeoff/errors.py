"""The exception tree every bakeoff failure is raised through.

Callers catch :class:`BakeoffError` to turn any expected failure into a clean message and
a non-zero exit; anything else escaping is a bug.
"""

from __future__ import annotations


class BakeoffError(Exception):
    """Base of every error bakeoff raises on purpose."""


class SpecError(BakeoffError):
    """A campaign, workload, backend or CLI value is invalid; raised before anything starts."""


class KnobError(SpecError):
    """A knob a backend does not have, or a value it does not accept."""


class ResultsError(BakeoffError):
    """A saved result (summary.json) is unreadable, invalid, or from a newer bakeoff."""


class LaunchError(BakeoffError):
    """A server could not be started or did not become ready."""


class RuntimeMissingError(LaunchError):
    """The container runtime (docker / podman) is not installed or not usable."""


class ServerUnreachableError(BakeoffError):
    """The benchmarked server does not answer at its base URL."""


class ServerDiedError(BakeoffError):
    """The server under test died mid-run; what it had answered is saved, the rest was not sent.

    ``verdict`` is the evidence, as written to ``summary.json`` under ``server_died``.
    """

    def __init__(self, message: str, verdict: dict[str, object]) -> None:
        super().__init__(message)
        self.verdict = verdict


class SmokeFailedError(BakeoffError):
    """A server failed a step of the smoke run; the real run was not started (``smoke.json`` has the rest)."""
