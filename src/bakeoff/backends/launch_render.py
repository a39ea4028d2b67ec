"""Rendering one backend's launch for one knob set: argv, environment and config file.

:func:`render_launch` resolves a backend's command template and knob map (flags,
environment variables, config-file keys) into what a launcher runs, refusing two knobs
on one flag. :func:`render_engine_build` renders TensorRT-LLM's engine-build steps with
the baked knobs appended; :func:`change_cost` says what going from one knob set to
another takes. The backend specs themselves are :mod:`bakeoff.backends.spec`.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from bakeoff.backends.knobs import PLACEHOLDER, check_fills, check_knob, fill, fill_values, launch_warnings, value_key
from bakeoff.backends.spec import DRAFT_MOUNT, BackendSpec, ChangeCost, KnobSpec, KnobValue
from bakeoff.errors import KnobError, SpecError


@dataclass
class RenderedLaunch:
    """Everything needed to start one backend with one knob set, fully resolved."""

    backend: BackendSpec
    argv: list[str]
    env: dict[str, str]
    config_text: str | None
    knobs: dict[str, KnobValue]
    non_default: dict[str, KnobValue] = field(default_factory=dict)
    # The framework's own warnings about values in use (e.g. vLLM on chunked prefill off):
    # `backends show` prints them and the report carries them beside the effort table.
    warnings: list[str] = field(default_factory=list)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    @property
    def effective_knobs(self) -> dict[str, KnobValue | None]:
        """Every knob the backend maps: the value set, else the backend's declared default."""
        return {name: self.knobs.get(name, spec.default) for name, spec in self.backend.knobs.items()}


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _fill_template(part: str, subs: dict[str, KnobValue], backend: BackendSpec) -> str:
    """Fill a command-template word; a placeholder nobody provides is a spec error."""
    for name, _ in PLACEHOLDER.findall(part):
        if name not in subs:
            raise SpecError(f"backend {backend.name!r}: command uses unknown placeholder {{{name}}}")
    return str(fill(part, subs))


def _native(spec: KnobSpec, value: KnobValue) -> Any:
    key = value_key(value)
    return copy.deepcopy(spec.value_map[key]) if key in spec.value_map else value


def flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _value_words(flag: str | None, native: Any) -> list[str]:
    """argv words for a value: ``flag VALUE``, or ``flag`` + list items, or the list alone."""
    words = [flag_text(v) for v in native] if isinstance(native, list) else [flag_text(native)]
    return [flag, *words] if flag else words


def _active_knobs(backend: BackendSpec, checked: dict[str, KnobValue]) -> list[tuple[str, KnobSpec, KnobValue]]:
    """(name, spec, value) for every knob that renders: set ones, and unset always_set ones."""
    active: list[tuple[str, KnobSpec, KnobValue]] = []
    for name, spec in backend.knobs.items():
        if name in checked:
            active.append((name, spec, checked[name]))
        elif spec.always_set and spec.default is not None:
            active.append((name, spec, spec.default))
    return active


def _claim(owners: dict[str, str], flag: str, knob: str, backend: BackendSpec) -> None:
    # Two knobs on one flag would silently let the last one win (argparse semantics).
    other = owners.setdefault(flag, knob)
    if other != knob:
        raise KnobError(f"backend {backend.name!r}: knobs {other!r} and {knob!r} both set {flag}; set only one of them")


def render_launch(
    backend: BackendSpec,
    knobs: dict[str, KnobValue],
    *,
    model: str,
    served_model_name: str,
    port: int,
    host: str = "127.0.0.1",
    python: str = "python",
    draft_model: str = DRAFT_MOUNT,
) -> RenderedLaunch:
    """Resolve the backend's command template and knob map into argv, env and config text."""
    checked = {name: check_knob(backend, name, value) for name, value in knobs.items()}
    subs: dict[str, KnobValue] = {
        **fill_values(backend, checked),
        "model": model,
        "served_model_name": served_model_name,
        "port": str(port),
        "host": host,
        "python": python,
        "draft_model": draft_model,
        "config_file": backend.config_file.filename if backend.config_file else "",
    }
    argv_tail: list[str] = []
    env = dict(backend.env)
    config: dict[str, Any] = copy.deepcopy(backend.config_file.base) if backend.config_file else {}
    owners: dict[str, str] = {}
    active = _active_knobs(backend, checked)
    for name, spec, value in active:
        # Filled before it becomes words or JSON, so a number placeholder stays a number.
        native = fill(_native(spec, value), subs)
        if native is None or spec.fills is not None:
            continue
        words: list[str] = []
        if spec.true_flag or spec.false_flag:
            flag = spec.true_flag if value else spec.false_flag
            words = shlex.split(flag) if flag else []
        elif spec.flag:
            words = _value_words(spec.flag, native)
        elif spec.env:
            env[spec.env] = flag_text(native)
        elif spec.config_key:
            _set_dotted(config, spec.config_key, native)
        if words:
            _claim(owners, words[0], name, backend)
            argv_tail.extend(str(fill(w, subs)) for w in words)
    config_text = None
    if backend.config_file is not None:
        config_text = yaml.safe_dump(config, sort_keys=True)
        argv_tail.extend([backend.config_file.flag, backend.config_file.filename])
    argv = [_fill_template(part, subs, backend) for part in backend.command] + argv_tail
    rendered = {name for name, spec, value in active if _native(spec, value) is not None}
    check_fills(backend, checked, rendered)
    non_default = {k: v for k, v in checked.items() if v != backend.knobs[k].default}
    warnings = launch_warnings(backend, {name: value for name, _, value in active})
    return RenderedLaunch(backend, argv, env, config_text, checked, non_default, warnings)


def baked_knobs(backend: BackendSpec, knobs: dict[str, KnobValue]) -> dict[str, KnobValue | None]:
    """The engine-build knobs with their effective values (the backend default when unset)."""
    checked = {name: check_knob(backend, name, value) for name, value in knobs.items()}
    return {
        name: checked.get(name, spec.default) for name, spec in backend.knobs.items() if spec.build_step is not None
    }


def render_engine_build(
    backend: BackendSpec,
    knobs: dict[str, KnobValue],
    *,
    model: str,
    checkpoint_dir: str,
    engine_dir: str,
) -> list[list[str]]:
    """The engine-build steps as argv lists, baked knobs appended to their step."""
    if backend.engine_build is None:
        raise SpecError(f"backend {backend.name!r} has no engine build")
    checked = {name: check_knob(backend, name, value) for name, value in knobs.items()}
    subs: dict[str, KnobValue] = {"model": model, "checkpoint_dir": checkpoint_dir, "engine_dir": engine_dir}
    steps = [[_fill_template(w, subs, backend) for w in step] for step in backend.engine_build.steps]
    owners: dict[str, str] = {}
    for name, spec, value in _active_knobs(backend, checked):
        if spec.build_step is None:
            continue
        native = _native(spec, value)
        if native is None:
            continue
        words = [str(fill(w, subs)) for w in _value_words(spec.build_flag, native)]
        if words:
            _claim(owners, f"step {spec.build_step} {words[0]}", name, backend)
            steps[spec.build_step].extend(words)
    return steps


def change_cost(backend: BackendSpec, before: dict[str, KnobValue], after: dict[str, KnobValue]) -> ChangeCost:
    """What it takes to go from one knob set to another: nothing, a restart or a rebuild."""
    order: list[ChangeCost] = ["nothing", "restart", "rebuild"]
    worst: ChangeCost = "nothing"
    for name in set(before) | set(after):
        if before.get(name) != after.get(name) and name in backend.knobs:
            needs = backend.knobs[name].change_needs
            if order.index(needs) > order.index(worst):
                worst = needs
    return worst
