"""The strict base of every user-written section, and its errors turned into lines a user can act on.

``Strict`` rejects unknown keys (a typo fails loudly instead of being ignored).
:func:`format_validation_error` renders a YAML file's pydantic errors as
``source: field.path: message``; :func:`flag_errors` renders the same errors for a command
line, naming the option instead of the field it fills. Both go through one cleaner of
pydantic's own wording, so a campaign file and a command line read alike.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, get_args

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


def _kind_of(model: type[BaseModel]) -> object:
    field = model.model_fields.get("kind")
    return None if field is None else field.default


def _steps(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[list[type[BaseModel]], list[int | str]]:
    """Walk ``loc`` from ``root``: the models it ends in, and the location as the user wrote it.

    List indexes are stepped over; a workload kind in the location (how pydantic names the
    member of a discriminated union) picks that member and is left out of the written
    location, since no YAML key is spelled that way. The tag is tried before field names: a
    ``concurrency`` step picks the concurrency kind even though ``multi_turn`` has a field so named.
    """
    candidates: list[type[BaseModel]] = [root]
    written: list[int | str] = []
    for i, part in enumerate(loc):
        if isinstance(part, int):
            written.append(part)
            continue
        tagged = [c for c in candidates if _kind_of(c) == part] if len(candidates) > 1 else []
        if tagged:
            candidates = tagged
            continue
        written.append(part)
        holders = [c for c in candidates if part in c.model_fields]
        candidates = _models_in(holders[0].model_fields[part].annotation) if holders else []
        if not candidates:  # past the last model (a dict's keys, a scalar): the rest as pydantic gave it
            return [], [*written, *loc[i + 1 :]]
    return candidates, written


def section_model(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the section at ``loc`` (a pydantic error location), when it is one model."""
    candidates, _ = _steps(root, loc)
    return candidates[0] if len(candidates) == 1 else None


def written_location(root: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    """``loc`` as the user would write it (``workloads.0.levels``, not ``workloads.0.concurrency.levels``)."""
    if root is not None and loc:
        _, written = _steps(root, loc[:-1])
        loc = (*written, loc[-1])
    return ".".join(str(p) for p in loc) or "(top level)"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'knobs'?)"`` for the closest of ``choices``, or nothing when none is close."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    # A short form of a longer key (warmup for warmup_requests) is too far off for difflib's ratio.
    close = close or [c for c in choices if len(word) >= 4 and c.startswith(word)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _plain(message: str) -> str:
    """Pydantic's own wording out: class names users never wrote, and its 'Value error, ' prefix."""
    message = re.sub(r"^(Value error|Assertion failed), ", "", message)
    message = re.sub(r"^Field required$", "missing: this field is required", message)
    mapping = r"Input should be a valid dictionary or instance of \w+"
    message = re.sub(mapping, "expected a mapping (key: value)", message)
    return re.sub(r"^Input should be ", "must be ", message)


def _tags(expected: object) -> list[str]:
    """The tags of a discriminated union, from pydantic's ``expected_tags`` text ("'a', 'b'")."""
    return re.findall(r"'([^']+)'", str(expected))


def _message(item: Mapping[str, Any], root: type[BaseModel] | None, hints: Mapping[str, str] | None) -> tuple[str, str]:
    """One error as (location, message) in the user's words."""
    loc = tuple(item["loc"])
    where = written_location(root, loc)
    kind = item["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else ""
        section = section_model(root, loc[:-1]) if root is not None else None
        valid = list(section.model_fields) if section is not None else []
        listed = f"; valid keys here: {', '.join(valid)}" if valid else ""
        return where, f"unknown key{did_you_mean(key, valid)}{listed}"
    if kind == "union_tag_invalid":
        ctx = item.get("ctx") or {}
        tag, tags = str(ctx.get("tag", "")), _tags(ctx.get("expected_tags", ""))
        field = str(ctx.get("discriminator", "kind")).strip("'")
        at = f"{where}.{field}" if where != "(top level)" else field
        return at, f"unknown {field} {tag!r}{did_you_mean(tag, tags)}; valid {field}s: {', '.join(tags)}"
    if kind == "union_tag_not_found":
        ctx = item.get("ctx") or {}
        field = str(ctx.get("discriminator", "kind")).strip("'")
        return where, f"no {field!r} given; add {field}: with one of the kinds"
    msg = _plain(item["msg"])
    if kind in ("model_type", "model_attributes_type", "dict_type") and hints and loc:
        hint = hints.get(str(loc[-1]))
        msg = f"{msg}; {hint}" if hint else msg
    return where, msg


def format_validation_error(
    source: str,
    err: ValidationError,
    root: type[BaseModel] | None = None,
    hints: Mapping[str, str] | None = None,
) -> str:
    """Render pydantic errors as 'source: field.path: message' lines a user can act on.

    An unknown key lists the valid keys of its section (``root`` is the model validated)
    and the closest one ("did you mean"); an unknown workload kind names the valid kinds;
    ``hints`` adds a section's accepted forms to a wrong-type error there (keyed by field name).
    """
    lines = []
    for item in err.errors():
        where, msg = _message(item, root, hints)
        lines.append(f"{source}: {where}: {msg}")
    return "\n".join(lines)


def flag_errors(err: ValidationError, flag_of: Callable[[tuple[int | str, ...]], str]) -> str:
    """A command line's pydantic errors as '--flag: message' parts, joined by '; '.

    ``flag_of`` names the option that fills a field location; the wording is cleaned as in
    :func:`format_validation_error`, so a flag and a YAML key get the same message.
    """
    return "; ".join(f"{flag_of(tuple(item['loc']))}: {_plain(item['msg'])}" for item in err.errors())
