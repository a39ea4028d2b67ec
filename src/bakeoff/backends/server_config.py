"""A campaign's ``servers:`` entry: one backend with one knob set, the unit that gets launched.

Validated where the user wrote it (label, URL, API-key variable, headers, image tag), so a bad
server entry fails before anything starts; :mod:`bakeoff.serving.launchers` starts it. A
rehearsal's servers carry ``launcher: rehearsal`` (:meth:`ServerConfig.for_rehearsal`, set by
``--rehearse``, never by hand): that, not a flag passed along, is what starts a GPU backend's
reference-server stand-in instead of its container.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from bakeoff.measure.auth import env_name_problem, header_problem
from bakeoff.schema import Strict

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


_BASE_URL = re.compile(r"^https?://[^/\s:]+(:\d{1,5})?(/\S*)?$")


class ServerConfig(Strict):
    """One backend with one knob set: the unit that gets launched."""

    backend: str
    label: str = ""
    knobs: dict[str, bool | int | float | str] = Field(default_factory=dict)
    cost_per_hour_usd: Annotated[float, Field(ge=0)] | None = None
    model_path: Path | None = Field(
        default=None, description="this server's packaging of the campaign model (e.g. a ModelOpt checkpoint)"
    )
    url: str | None = Field(default=None, description="benchmark an already running server")
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the server's API key (sent as a bearer token)"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers on every request")
    image_tag: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="container backends: this tag of the backend's image instead of its pinned one ('latest': "
        "pulled on every run; the digest actually run is recorded)",
    )
    gpu_type: str | None = Field(
        default=None, description="campaign run --ray: GPU model this server needs (Ray's accelerator type, e.g. H100)"
    )
    launcher: Literal["rehearsal"] | None = Field(
        default=None,
        description="set by --rehearse, never by hand: a GPU backend's reference-server stand-in starts "
        "instead of its container",
    )

    def for_rehearsal(self) -> ServerConfig:
        """This server in a rehearsal: a GPU backend's stand-in starts in place of its container."""
        return self.model_copy(update={"launcher": "rehearsal"})

    @property
    def rehearsed(self) -> bool:
        """Whether this server belongs to a rehearsal (nothing it serves is a measurement)."""
        return self.launcher == "rehearsal"

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Unset, the launcher is left out: a measured server's record and fingerprint read as before it existed.
        data: dict[str, Any] = handler(self)
        if self.launcher is None:
            data.pop("launcher", None)
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not _BASE_URL.match(value):
            raise ValueError(f"{value!r} is not a base URL; write it as http(s)://host[:port][/prefix]")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _api_key_env(cls, value: str | None) -> str | None:
        problem = None if value is None else env_name_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; name the variable, never the key itself")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            problem = header_problem(name, text)
            if problem is not None:
                raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_authorization(self) -> ServerConfig:
        if self.api_key_env is not None and any(n.lower() == "authorization" for n in self.headers):
            raise ValueError("api_key_env and headers.Authorization both set the key; keep one of them")
        return self

    @model_validator(mode="after")
    def _label(self) -> ServerConfig:
        if not self.label:
            self.label = self.backend
        if not _LABEL.match(self.label):
            raise ValueError(f"label {self.label!r} must be letters, digits, '.', '_' or '-'")
        return self
