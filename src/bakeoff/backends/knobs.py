"""Knob values: checking one against a backend, and the parts of rendering that need values.

:mod:`bakeoff.backends.spec` owns the specs and assembles a launch; this module owns what a
*value* may be and what it implies:

- :func:`check_knob` refuses a knob the backend lacks, a value outside its choices or
  bounds, and a value the pinned framework version cannot take (``refused_values``,
  whose reason is quoted), before anything starts.
- A knob with ``fills`` is a parameter of another knob (``num_speculative_tokens`` of
  ``speculative``): it renders nothing itself, and its value fills ``{name}`` (or
  ``{name+1}``) inside the other knob's native value, keeping its type (an int stays an
  int inside JSON). Setting it while the knob it fills renders nothing is refused.
- ``value_warnings`` turn a value into a warning for the report (:func:`launch_warnings`).
- :func:`draft_model_knob` says which knob needs a draft model mounted.
- :func:`apply_pins` sets a ``pin_with`` knob alike on every server of a backend once any
  of them turns the knob it is pinned with on (vLLM's async scheduling, whose default
  differs between releases and speculative methods).
- :func:`effective_dtypes` says what a server stores weights and KV cache in.
- :func:`model_file_choice` reads the knob that picks the model file (``model_file: true``,
  llama.cpp's ``quantization``), which renders no flag: the launcher serves that file.
- :func:`resolve_space` checks a tune space (:mod:`bakeoff.backends.tune_space`) against the
  backend: every range's bounds and every choice must pass :func:`check_knob`;
  :func:`broken_constraints` words the constraints a trial's knob values break.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bakeoff.backends.spec import KNOB_VOCABULARY
from bakeoff.errors import KnobError, SpecError
from bakeoff.schema import did_you_mean

if TYPE_CHECKING:
    from bakeoff.backends.spec import BackendSpec, KnobSpec, KnobValue
    from bakeoff.backends.tune_space import TuneSpace

# {name} or {name+N}; other braces (JSON, shell) are left alone.
PLACEHOLDER = re.compile(r"\{([a-z_]+)(?:\+(\d+))?\}")
DRAFT_PLACEHOLDER = "{draft_model}"


def check_knob(backend: BackendSpec, name: str, value: KnobValue) -> KnobValue:
    """Validate one knob value for a backend and return it coerced to the knob's type."""
    where = f"backend {backend.name!r}, knob {name!r}"
    if name not in KNOB_VOCABULARY:
        hint = did_you_mean(name, backend.knobs) or did_you_mean(name, KNOB_VOCABULARY)
        raise KnobError(f"{where}: not a bakeoff knob{hint}; known knobs: {', '.join(KNOB_VOCABULARY)}")
    spec = backend.knobs.get(name)
    if spec is None:
        have = ", ".join(sorted(backend.knobs)) or "none"
        reason = backend.unsupported.get(name)
        why = f": {reason}" if reason else ""
        raise KnobError(f"{where}: {backend.name} has no such knob{why}; it supports: {have}")
    coerced = _coerce(spec, value, where)
    refused = spec.refused_values.get(value_key(coerced))
    if refused is not None:
        raise KnobError(f"{where}: {backend.name} {backend.version} cannot take {coerced!r}: {refused}")
    if spec.choices is not None and coerced not in spec.choices:
        allowed = ", ".join(map(str, spec.choices))
        raise KnobError(f"{where}: value {value!r} not accepted; choose one of: {allowed}")
    if isinstance(coerced, int | float) and not isinstance(coerced, bool):
        if spec.minimum is not None and coerced < spec.minimum:
            raise KnobError(f"{where}: {value!r} is below the minimum {spec.minimum}")
        if spec.maximum is not None and coerced > spec.maximum:
            raise KnobError(f"{where}: {value!r} is above the maximum {spec.maximum}")
    return coerced


def _coerce(spec: KnobSpec, value: KnobValue, where: str) -> KnobValue:
    if spec.type == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("true", "on", "1", "yes"):
            return True
        if text in ("false", "off", "0", "no"):
            return False
        raise KnobError(f"{where}: expected true/false, got {value!r}")
    try:
        if spec.type == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if spec.type == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
    except (TypeError, ValueError):
        raise KnobError(f"{where}: expected a {spec.type}, got {value!r}") from None
    return str(value)


def parse_knob_args(pairs: list[str]) -> dict[str, KnobValue]:
    """Turn CLI ``k=v`` pairs into a dict; types are settled later by :func:`check_knob`."""
    knobs: dict[str, KnobValue] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--knob {pair!r}: write it as name=value, e.g. max_num_seqs=64")
        knobs[key.strip()] = value.strip()
    return knobs


def value_key(value: KnobValue) -> str:
    """How a value is spelled as a key of value_map, refused_values and value_warnings."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def fill(value: Any, subs: dict[str, KnobValue]) -> Any:
    """Replace known placeholders in strings, deep; a string that is one placeholder keeps its type."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole is not None and whole.group(1) in subs:
            return _sub(whole, subs)
        return PLACEHOLDER.sub(lambda m: str(_sub(m, subs)) if m.group(1) in subs else m.group(0), value)
    if isinstance(value, list):
        return [fill(v, subs) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, subs) for k, v in value.items()}
    return value


def _sub(match: re.Match[str], subs: dict[str, KnobValue]) -> KnobValue:
    value = subs[match.group(1)]
    if match.group(2) is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"placeholder {match.group(0)} adds to {match.group(1)}, which is not a whole number")
    return value + int(match.group(2))


def fill_values(backend: BackendSpec, checked: dict[str, KnobValue]) -> dict[str, KnobValue]:
    """``{knob: value}`` of every knob that fills another: set, or its default."""
    values: dict[str, KnobValue] = {}
    for name, spec in backend.knobs.items():
        if spec.fills is None:
            continue
        value = checked.get(name, spec.default)
        if value is not None:
            values[name] = value
    return values


def check_fills(backend: BackendSpec, checked: dict[str, KnobValue], rendered: set[str]) -> None:
    """Refuse a knob set for another one (``rendered``: knobs that render something) that is off."""
    for name in checked:
        target = backend.knobs[name].fills
        if target is not None and target not in rendered:
            raise KnobError(
                f"backend {backend.name!r}, knob {name!r}: only takes effect with {target!r} set to a "
                f"method; set {target} or drop {name}"
            )


def launch_warnings(backend: BackendSpec, active: dict[str, KnobValue]) -> list[str]:
    """The framework's own warnings about the values in use, one line each."""
    warnings = []
    for name, value in active.items():
        text = backend.knobs[name].value_warnings.get(value_key(value))
        if text:
            warnings.append(f"{backend.name}: {name}={value_key(value)}: {text}")
    return warnings


def draft_model_knob(backend: BackendSpec, knobs: dict[str, KnobValue]) -> str | None:
    """The knob whose value needs a draft model (its native value names ``{draft_model}``), if any."""
    for name, value in knobs.items():
        spec = backend.knobs.get(name)
        if spec is None:
            continue
        native = spec.value_map.get(value_key(check_knob(backend, name, value)))
        if native is not None and DRAFT_PLACEHOLDER in json.dumps(native):
            return name
    return None


def renders(backend: BackendSpec, name: str, value: KnobValue) -> bool:
    """Whether a knob value renders anything (``none`` of a value_map renders nothing)."""
    spec = backend.knobs[name]
    key = value_key(check_knob(backend, name, value))
    return key not in spec.value_map or spec.value_map[key] is not None


def apply_pins(servers: list[tuple[BackendSpec, dict[str, KnobValue]]]) -> list[dict[str, KnobValue]]:
    """Each server's knobs with the pins of its backend added where the campaign needs them.

    A knob with ``pin_with`` is set to the pin's value on every server of that backend that
    leaves it unset, as soon as one server of the backend sets the knob it is pinned with
    to something that renders: the campaign then compares what that knob changes, and the
    pinned knob must not differ silently between releases or methods.
    """
    triggered: set[tuple[str, str]] = set()
    for backend, knobs in servers:
        for name, spec in backend.knobs.items():
            pin = spec.pin_with
            if pin is not None and pin.knob in knobs and renders(backend, pin.knob, knobs[pin.knob]):
                triggered.add((backend.name, name))
    pinned = []
    for backend, knobs in servers:
        extra: dict[str, KnobValue] = {}
        for name, spec in backend.knobs.items():
            if (backend.name, name) in triggered and name not in knobs and spec.pin_with is not None:
                extra[name] = spec.pin_with.value
        pinned.append({**knobs, **extra})
    return pinned


def model_file_choice(backend: BackendSpec, knobs: dict[str, KnobValue]) -> str:
    """The value of the backend's ``model_file`` knob (set, else its default); "none" without one."""
    for name, spec in backend.knobs.items():
        if spec.model_file:
            value = check_knob(backend, name, knobs[name]) if name in knobs else spec.default
            return "none" if value is None else value_key(value)
    return "none"


def effective_dtypes(
    backend: BackendSpec, knobs: dict[str, KnobValue], weight_types: dict[str, int] | None
) -> dict[str, str]:
    """The weight and KV-cache types a server runs with, for the report.

    ``weight_types``: the served file's tensor types by count (what llama-quantize or GPTQ
    actually wrote); otherwise the quantization knob's value, or the ``dtype`` knob. KV
    ``auto`` is llama.cpp's f16 for GGUF backends and the
    weights' dtype for the others.
    """

    def value(name: str) -> str | None:
        if name in knobs:
            return value_key(check_knob(backend, name, knobs[name]))
        spec = backend.knobs.get(name)
        return None if spec is None or spec.default is None else value_key(spec.default)

    dtype = value("dtype") or "model dtype"
    # Unread (no server yet): a quantized model file is named by its knob value.
    chosen = model_file_choice(backend, knobs)
    weights = chosen if chosen != "none" else dtype
    if weight_types:
        weights = ", ".join(f"{name} x{count}" for name, count in weight_types.items())
    kv = value("kv_cache_dtype") or "auto"
    if kv == "auto":
        kv = "f16" if backend.model_format == "gguf" else dtype
    return {"weights": weights, "kv_cache": kv}


def resolve_space(backend: BackendSpec, space: TuneSpace, where: str, only: list[str] | None = None) -> TuneSpace:
    """Check a space against the backend: every knob mapped, every bound and choice accepted.

    ``only``: knobs a campaign asked for; one without a range anywhere names the fix.
    """
    from bakeoff.backends.spec import KNOB_VOCABULARY

    unknown = sorted(space.named() - set(KNOB_VOCABULARY))
    if unknown:
        raise SpecError(f"{where}: not bakeoff knobs: {', '.join(unknown)}; known knobs: {', '.join(KNOB_VOCABULARY)}")
    for name in only or []:
        if name not in space.knobs:
            raise SpecError(
                f"{where}.knobs: {name!r} has no search range for backend {backend.name!r}; add "
                f"{{{name}: {{low: ..., high: ...}}}} or {{{name}: {{choices: [...]}}}} under tune.knobs"
            )
    for name, rng in space.knobs.items():
        values: list[KnobValue] = list(rng.choices or [])
        if rng.low is not None and rng.high is not None:
            values += [_typed(backend, name, rng.low), _typed(backend, name, rng.high)]
        for value in values:
            try:
                check_knob(backend, name, value)
            except KnobError as exc:
                raise SpecError(f"{where}.knobs.{name}: {exc}; narrow the range or fix the choices") from exc
        if rng.choices is None and backend.knobs[name].type not in ("int", "float"):
            raise SpecError(f"{where}.knobs.{name}: a {backend.knobs[name].type} knob needs choices, not a range")
    for i, constraint in enumerate(space.constraints):
        missing = sorted(n for n in constraint.names() if n not in backend.knobs)
        if missing:
            raise SpecError(
                f"{where}.constraints[{i}]: backend {backend.name!r} has no knob {', '.join(missing)}; "
                "drop the constraint or name a knob it maps"
            )
    return space


def _typed(backend: BackendSpec, name: str, value: float) -> KnobValue:
    spec = backend.knobs.get(name)
    return int(value) if spec is not None and spec.type == "int" else value


def knob_defaults(backend: BackendSpec) -> dict[str, KnobValue | None]:
    return {name: spec.default for name, spec in backend.knobs.items()}


def broken_constraints(space: TuneSpace, backend: BackendSpec, knobs: Mapping[str, KnobValue]) -> list[str]:
    """Every constraint these knob values break, worded for the trial table."""
    found = [c.violated(knobs, knob_defaults(backend)) for c in space.constraints]
    return [text for text in found if text is not None]
