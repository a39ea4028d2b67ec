"""``bakeoff backends audit``: a backend YAML held against the framework's released wheel.

:func:`audit_backend` checks, against what :mod:`bakeoff.conformance.wheel_scan` read from the
wheel, every flag the backend renders (command template, knob flags and the flags inside
value maps), every value it passes to a flag with declared choices, every key of a JSON
value against the config class it fills, every declared knob default, every metric name it
scrapes, every endpoint it calls and every request field it sends. Each becomes a row:
``ok``, ``changed`` (deprecated, hidden, a default or a choice set that moved) or
``missing``, with the file and line in the wheel. A missing flag and a changed declared
default are *fatal*: the exit status is non-zero.

:func:`diff_wheels` (``--against``) compares two releases: new and removed flags, changed
flag defaults, metric names that appeared or went.

Wheels come from a file or ``name==version``, fetched once with ``pip download --no-deps``
into ``<user cache>/wheels``; the index read from a wheel is cached beside it as JSON.
Which wheel and which of its folders a backend is audited against is the backend YAML's
``audit`` section; a framework without a public wheel (TensorRT-LLM) says so there.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bakeoff.backends.knobs import value_key
from bakeoff.backends.spec import BackendSpec, KnobSpec, load_backend
from bakeoff.conformance.wheel_scan import ConfigField, Flag, Metric, Site, WheelIndex, scan_wheel
from bakeoff.errors import SpecError
from bakeoff.paths import user_cache_dir
from bakeoff.results.layout import load_yaml

# Bump when wheel_scan reads more or differently: cached indexes are then read again.
SCAN_VERSION = 8
# The OpenAI-compatible endpoints the load generator sends requests to.
CLIENT_ROUTES = ("/v1/completions", "/v1/chat/completions")


def wheel_cache() -> Path:
    return user_cache_dir() / "wheels"


@dataclass(frozen=True)
class Row:
    kind: str  # flag, value, key, default, metric, route, field
    item: str
    status: str  # ok, changed, missing
    where: str
    detail: str = ""
    fatal: bool = False


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def resolve_wheel(spec: str, cache: Path | None = None) -> Path:
    """A wheel file; ``name==version`` from the cache, downloaded there once when missing; a bare
    ``name``: the newest release on the index, asked for every time (the drift job)."""
    path = Path(spec).expanduser()
    if path.suffix == ".whl":
        if not path.is_file():
            raise SpecError(f"--wheel {spec}: no such file")
        return path
    name, sep, version = spec.partition("==")
    if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or (sep and not version):
        raise SpecError(f"--wheel {spec!r}: give a .whl file, name==version (vllm==0.33.0) or a name (the newest)")
    folder = cache or wheel_cache()
    prefix = f"{_normalize(name)}-{version}-"
    found = (
        sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix)) if sep and folder.is_dir() else []
    )
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    # pip names the file it saved, or the one already there.
    named = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", proc.stdout)
    found = [folder / Path(named[-1]).name] if named else []
    if sep and not found:
        found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix))
    if proc.returncode != 0 or not found or not found[0].is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SpecError(
            f"--wheel {spec}: pip download failed ({tail[0]}); without network, put the wheel in {folder} "
            f"(scripts/fetch-wheels.sh does) or pass its path"
        )
    return found[0]


def _from_json(data: dict[str, Any]) -> WheelIndex:
    def site(d: dict[str, Any]) -> Site:
        return Site(d["file"], d["line"])

    def tup(v: Any) -> tuple[str, ...] | None:
        return tuple(v) if v is not None else None

    index = WheelIndex(data["source"], enable_disable=data["enable_disable"])
    index.flags = {
        k: Flag(**{**v, "site": site(v["site"]), "choices": tup(v["choices"])}) for k, v in data["flags"].items()
    }
    index.fields = {
        k: [ConfigField(**{**f, "site": site(f["site"]), "choices": tup(f["choices"])}) for f in v]
        for k, v in data["fields"].items()
    }
    index.metrics = {k: Metric(v["name"], v["kind"], site(v["site"])) for k, v in data["metrics"].items()}
    index.routes = {k: site(v) for k, v in data["routes"].items()}
    index.validators = {k: site(v) for k, v in data["validators"].items()}
    return index


def load_index(wheel: Path, packages: tuple[str, ...]) -> WheelIndex:
    """The wheel's index, read once and cached beside the wheel (keyed by size, packages, scanner)."""
    key = f"{wheel.stat().st_size}-{SCAN_VERSION}-{'+'.join(packages)}"
    cached = wheel.parent / "index" / f"{wheel.name}.json"
    try:
        data = json.loads(cached.read_text())
        if data.get("key") == key:
            return _from_json(data["index"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    index = scan_wheel(wheel, packages)
    body = asdict(index)
    body.pop("literals"), body.pop("flag_classes"), body.pop("bases")
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"key": key, "index": body}))
    return index


# --- what the backend renders ----------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    flag: str
    source: str  # where in the YAML: command, knob name
    values: tuple[str, ...] = ()


def _words_flags(words: list[str], source: str) -> list[Rendered]:
    out = []
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
            values = (nxt,) if nxt is not None and "{" not in nxt else ()
            out.append(Rendered(word, source, values))
    return out


def rendered_flags(backend: BackendSpec) -> list[Rendered]:
    """Every flag the backend can render, with the literal values it may pass."""
    out = _words_flags([w for w in backend.command if "{" not in w or not w.startswith("--")], "command")
    if backend.config_file is not None:
        out.append(Rendered(backend.config_file.flag, "config_file"))
    for name, spec in backend.knobs.items():
        for flag in (spec.true_flag, spec.false_flag):
            if flag:
                out += _words_flags(shlex.split(flag), name)
        if spec.flag:
            values = []
            for choice in spec.choices or []:
                native = spec.value_map.get(value_key(choice), choice)
                if isinstance(native, list):
                    out += _words_flags([str(w) for w in native[1:]], name)
                    native = native[0]
                if isinstance(native, str | int | float) and not isinstance(native, bool) and "{" not in str(native):
                    values.append(str(native))
            out.append(Rendered(spec.flag, name, tuple(values)))
    return out


# --- checks ----------------------------------------------------------------------------


def _flag_row(index: WheelIndex, item: Rendered) -> tuple[Row, Flag | None]:
    flag = index.flags.get(item.flag)
    if flag is not None:
        status, detail = "ok", ""
        if flag.deprecated:
            status, detail = "changed", "deprecated (still parsed)"
        elif flag.hidden:
            status, detail = "changed", "hidden from --help (still parsed)"
        return Row("flag", f"{item.flag} ({item.source})", status, str(flag.site), detail), flag
    # --no-X (BooleanOptionalAction), --disable-X for --enable-X (vLLM 0.33's EnableDisableAction).
    for prefix, stem in (("--no-", "--"), ("--disable-", "--enable-")):
        if item.flag.startswith(prefix):
            base = index.flags.get(stem + item.flag.removeprefix(prefix))
            if base is not None and base.optional_bool and (prefix == "--no-" or index.enable_disable):
                hidden = prefix == "--no-" and index.enable_disable and base.name.startswith("--enable-")
                detail = f"negation of {base.name}" + (
                    "; hidden from --help in favour of --disable-" + base.name.removeprefix("--enable-")
                    if hidden
                    else ""
                )
                return Row(
                    "flag", f"{item.flag} ({item.source})", "changed" if hidden else "ok", str(base.site), detail
                ), base
    return Row("flag", f"{item.flag} ({item.source})", "missing", "-", "not declared in the wheel", fatal=True), None


def _value_rows(item: Rendered, flag: Flag) -> list[Row]:
    rows = []
    for value in item.values:
        if flag.choices is None or value.lstrip("-").isdigit():
            continue
        status = "ok" if value in flag.choices else "missing"
        detail = "" if status == "ok" else f"not among its choices ({len(flag.choices)} declared)"
        rows.append(Row("value", f"{item.flag} {value}", status, str(flag.site), detail, fatal=status == "missing"))
    return rows


def _config_class(dest: str) -> str:
    # speculative_config -> SpeculativeConfig: the class a JSON-valued flag fills.
    return "".join(part.capitalize() for part in dest.split("_"))


def _json_key_rows(index: WheelIndex, spec: KnobSpec, flag: Flag) -> list[Row]:
    rows = []
    owner = _config_class(flag.dest)
    for native in spec.value_map.values():
        if not isinstance(native, dict):
            continue
        for key, value in native.items():
            found = index.field_of(key, owner)
            if found is None:
                rows.append(Row("key", f"{flag.name} {key}", "missing", "-", f"no field {owner}.{key}", fatal=True))
                continue
            bad = isinstance(value, str) and "{" not in value and found.choices and value not in found.choices
            detail = f"{value!r} not among {owner}.{key}'s choices" if bad else ""
            rows.append(
                Row("key", f"{flag.name} {key}", "missing" if bad else "ok", str(found.site), detail, bool(bad))
            )
    return rows


def _literal(text: str | None) -> Any:
    try:
        return ast.literal_eval(text) if text is not None else None
    except (ValueError, SyntaxError, TypeError):  # a call or a name: not a literal default
        return _NOT_LITERAL


_NOT_LITERAL = object()


def _default_row(name: str, spec: KnobSpec, index: WheelIndex) -> Row | None:
    """The knob's declared default against the framework's, in the framework's terms."""
    if spec.fills is not None or spec.config_key or spec.env:
        return None
    if spec.flag:
        flag = index.flags.get(spec.flag)
        expected = None if spec.default is None else spec.value_map.get(value_key(spec.default), spec.default)
        if isinstance(expected, dict | list):
            expected = None
    else:
        words = shlex.split(spec.true_flag or spec.false_flag or "")
        if len(words) != 1:
            return None  # a flag with a value standing in for a bool (SGLang's --chunked-prefill-size -1)
        word, sets_true = words[0], spec.true_flag is not None
        flag = index.flags.get(word)
        negated = False
        for prefix, stem in (("--no-", "--"), ("--disable-", "--enable-")):
            if flag is None and word.startswith(prefix):
                flag, negated = index.flags.get(stem + word.removeprefix(prefix)), True
        # Passing the word sets the field to not-negated; the knob is then sets_true.
        expected = None if spec.default is None else spec.default if sets_true != negated else not spec.default
    if flag is None:
        return None  # reported as a missing flag already
    declared_text, site = index.declared_default(flag)
    where = str(site)
    declared = _literal(declared_text)
    item = f"{name} = {spec.default!r}"
    if spec.always_set:
        # bakeoff renders this knob every time: its declared default is bakeoff's choice, not the framework's.
        return Row("default", item, "ok", where, f"always rendered; {flag.dest} = {declared_text} unset")
    if declared is _NOT_LITERAL:
        return Row("default", item, "ok", where, f"computed: {declared_text}")
    if declared is None and expected is not None and spec.default_resolved:
        return Row("default", item, "ok", where, f"None: resolved at start to {expected!r} (read in the code)")
    if declared is None and expected is not None:
        # A concrete YAML default against None: the framework now decides at start (vLLM 0.34's
        # gpu_memory_utilization: 1.0 with the extensible KV cache, was 0.92), so the "defaults"
        # cells would no longer run what the YAML says.
        return Row(
            "default", item, "changed", where, f"{flag.dest} = None (decided at start), YAML implies {expected!r}", True
        )
    # An empty string is how some fields say "unset" (vLLM's reasoning_parser = "").
    same = declared == expected or (isinstance(expected, str) and str(declared) == expected)
    same = same or (expected is None and declared == "")
    if same:
        return Row("default", item, "ok", where, f"{flag.dest} = {declared_text}")
    return Row("default", item, "changed", where, f"{flag.dest} = {declared_text}, YAML implies {expected!r}", True)


def audit_backend(backend: BackendSpec, index: WheelIndex) -> list[Row]:
    """Every flag, value, JSON key, default, metric, route and request field of the backend, checked."""
    rows: list[Row] = []
    seen: set[tuple[str, str]] = set()
    for item in rendered_flags(backend):
        if (item.flag, item.source) in seen:
            continue
        seen.add((item.flag, item.source))
        row, flag = _flag_row(index, item)
        rows.append(row)
        if flag is not None and flag.name == item.flag:
            rows += _value_rows(item, flag)
            spec = backend.knobs.get(item.source)
            if spec is not None and spec.flag == item.flag:
                rows += _json_key_rows(index, spec, flag)
    for name, spec in backend.knobs.items():
        default = _default_row(name, spec, index)
        if default is not None:
            rows.append(default)
    if backend.metrics.format == "prometheus":
        for logical, metric_name in backend.metrics.names.items():
            metric = index.metric(metric_name)
            status = "ok" if metric is not None else "missing"
            where = str(metric.site) if metric else "-"
            rows.append(
                Row(
                    "metric",
                    f"{metric_name} ({logical})",
                    status,
                    where,
                    "" if metric else "no constructor",
                    metric is None,
                )
            )
    paths = [backend.health.path, backend.metrics.path, *CLIENT_ROUTES]
    if backend.cache_reset.kind == "http" and backend.cache_reset.path:
        paths.append(backend.cache_reset.path)
    for path in dict.fromkeys(p for p in paths if p):
        site = index.routes.get(path)
        rows.append(Row("route", path, "ok" if site else "missing", str(site) if site else "-", "", site is None))
    fields = [*backend.request.extra_body, *(["min_tokens"] if backend.request.min_tokens else [])]
    for name in fields:
        found = [f for f in index.fields.get(name, []) if f.owner.endswith("CompletionRequest")]
        where = str(found[0].site) if found else "-"
        rows.append(Row("field", f"request.{name}", "ok" if found else "missing", where, "", not found))
    return list(dict.fromkeys(rows))  # one row per check: value maps repeat JSON keys


def format_rows(rows: list[Row]) -> str:
    header = ("kind", "item", "status", "where", "detail")
    table = [header, *((r.kind, r.item, r.status + ("!" if r.fatal else ""), r.where, r.detail) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line[:4], widths, strict=True)) + "  " + line[4] for line in table
    ]
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "changed", "missing")}
    fatal = sum(r.fatal for r in rows)
    summary = f"{counts['ok']} ok, {counts['changed']} changed, {counts['missing']} missing; {fatal} fatal (marked !)"
    return "\n".join([*(line.rstrip() for line in lines), "", summary])


# --- two releases ----------------------------------------------------------------------


@dataclass
class WheelDiff:
    new_flags: list[str]
    removed_flags: list[str]
    changed_defaults: list[tuple[str, str | None, str | None]]
    new_metrics: list[str]
    removed_metrics: list[str]
    new_checks: list[str]  # start-up validators the old release lacked, with file:line
    moved: list[str]  # "old file -> new file: N flags": where definitions moved (SGLang's arg_groups split)
    negation: str | None  # how --enable-X's opposite is spelled, when that changed


def _moved(old: WheelIndex, new: WheelIndex, both: list[str]) -> list[str]:
    counts: dict[tuple[str, str], int] = {}
    for name in both:
        pair = (old.declared_default(old.flags[name])[1].file, new.declared_default(new.flags[name])[1].file)
        if pair[0] != pair[1]:
            counts[pair] = counts.get(pair, 0) + 1
    return [f"{a} -> {b}: {n} flags" for (a, b), n in sorted(counts.items(), key=lambda kv: -kv[1])]


def diff_wheels(old: WheelIndex, new: WheelIndex) -> WheelDiff:
    def default(index: WheelIndex, flag: Flag) -> str | None:
        return index.declared_default(flag)[0]

    both = sorted(set(old.flags) & set(new.flags))
    changed = [
        (name, default(old, old.flags[name]), default(new, new.flags[name]))
        for name in both
        if default(old, old.flags[name]) != default(new, new.flags[name])
    ]
    return WheelDiff(
        sorted(set(new.flags) - set(old.flags)),
        sorted(set(old.flags) - set(new.flags)),
        changed,
        sorted(set(new.metrics) - set(old.metrics)),
        sorted(set(old.metrics) - set(new.metrics)),
        [f"{name} ({new.validators[name]})" for name in sorted(set(new.validators) - set(old.validators))],
        _moved(old, new, both),
        (
            "--enable-X now pairs with --disable-X; --no-enable-X still parses but is hidden from --help"
            if new.enable_disable and not old.enable_disable
            else None
        ),
    )


def format_diff(diff: WheelDiff, backend: BackendSpec, old: str, new: str) -> str:
    renders = {r.flag for r in rendered_flags(backend)}
    scraped = {n.removesuffix("_total") for n in backend.metrics.names.values()}

    def mark(name: str, used: set[str]) -> str:
        return f"{name}  <- {backend.name} uses it" if name in used or name.removesuffix("_total") in used else name

    lines = [f"{old} -> {new}"]
    sections: list[tuple[str, list[str]]] = [
        ("new flags", diff.new_flags),
        ("removed flags", [mark(f, renders) for f in diff.removed_flags]),
        (
            "changed defaults",
            [
                mark(f"{n}: {a} -> {b}", renders) if n in renders else f"{n}: {a} -> {b}"
                for n, a, b in diff.changed_defaults
            ],
        ),
        ("new metrics", diff.new_metrics),
        ("removed metrics", [mark(m, scraped) for m in diff.removed_metrics]),
        ("new start-up checks", diff.new_checks),
        ("definitions moved", diff.moved),
    ]
    if diff.negation is not None:
        sections.insert(2, ("negated flags", [diff.negation]))
    for title, items in sections:
        lines += ["", f"{title} ({len(items)}):", *(f"  {i}" for i in items)]
    return "\n".join(lines)


def audit(
    name: str, wheel: str, against: str | None = None, write_defaults: Path | None = None, *, missing_only: bool = False
) -> tuple[str, int]:
    """``bakeoff backends audit``: the report text and the exit status (1 on a fatal row).

    ``write_defaults`` rewrites this backend's section of a pinned defaults table (YAML)
    from what the wheel declares; ``missing_only`` (the drift job) fails on missing rows and on
    changed defaults only: a hidden or deprecated flag still works, but a moved default changes
    what a "framework defaults" cell measures, and the drift job must catch it by itself.
    """
    backend = load_backend(name)
    spec = backend.audit
    if spec is None or spec.distribution is None:
        why = spec.note if spec is not None and spec.note else "its YAML names no wheel to read"
        return f"backend {name!r} cannot be audited from a wheel: {why}", 0
    packages = tuple(spec.packages) or (spec.distribution.replace("-", "_") + "/",)
    path = resolve_wheel(wheel)
    index = load_index(path, packages)
    rows = audit_backend(backend, index)
    text = f"{name} ({backend.version}) against {path.name}\n\n{format_rows(rows)}"
    if write_defaults is not None:
        write_defaults_table(write_defaults, backend, index)
        text += f"\n\nwrote {name}'s defaults to {write_defaults}"
    if against is not None:
        old_path = resolve_wheel(against)
        text += "\n\n" + format_diff(
            diff_wheels(load_index(old_path, packages), index), backend, old_path.name, path.name
        )
    failing = [r for r in rows if r.fatal and (r.status == "missing" or r.kind == "default" or not missing_only)]
    return text, int(bool(failing))


# --- the pinned defaults table (tests/data/framework_defaults.yaml) --------------------

_TABLE_HEADER = """\
# The defaults of bakeoff's knobs as the released wheels declare them, pinned here so
# tests/test_gpu_checks.py can hold backends/vllm.yaml and backends/sglang.yaml to them.
# Generated, not written by hand: `bakeoff backends audit NAME --wheel NAME==VERSION
# --write-defaults tests/data/framework_defaults.yaml` (file:line in that wheel). `default` is in
# bakeoff's vocabulary (null = chosen by the framework at start; "none" = renders nothing);
# `bakeoff_default_because` says why bakeoff picks its own where the framework has none.
"""


def write_defaults_table(path: Path, backend: BackendSpec, index: WheelIndex) -> None:
    data = load_yaml(path.read_text()) if path.is_file() else {}
    data = data if isinstance(data, dict) else {}
    data[backend.name] = defaults_table(backend, index, data.get(backend.name))
    path.write_text(_TABLE_HEADER + yaml.safe_dump(data, sort_keys=False, width=100))


def _placeholder_source(name: str, backend: BackendSpec, index: WheelIndex) -> str | None:
    """Where a ``fills`` knob lands: the flag before ``{name}`` in a list, or the JSON key holding it."""
    target = backend.knobs.get(backend.knobs[name].fills or "")
    if target is None:
        return None
    for native in target.value_map.values():
        if isinstance(native, list):
            words = [str(w) for w in native]
            for i, word in enumerate(words[1:], start=1):
                flag = index.flags.get(words[i - 1])
                if word.startswith("{" + name) and flag is not None:
                    text, site = index.declared_default(flag)
                    return f"{site}: {flag.dest} = {text}"
        if isinstance(native, dict) and target.flag and (flag := index.flags.get(target.flag)) is not None:
            for key, value in native.items():
                found = index.field_of(key, _config_class(flag.dest))
                if value == "{" + name + "}" and found is not None:
                    return f"{found.site}: {found.owner}.{key} = {found.default}"
    return None


def defaults_table(backend: BackendSpec, index: WheelIndex, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The backend's declared defaults with where the wheel declares each: the pinned table, regenerated.

    ``bakeoff_default_because`` (why bakeoff picks its own default for a knob the framework
    leaves open) is carried over from ``old``, the table as it stood.
    """
    knobs: dict[str, Any] = {}
    rows = {r.item.split(" = ")[0]: r for r in audit_backend(backend, index) if r.kind == "default"}
    for name, spec in backend.knobs.items():
        row = rows.get(name)
        source = f"{row.where}: {row.detail}" if row is not None else None
        if source is None and spec.fills is not None:
            source = _placeholder_source(name, backend, index)
        if source is None:
            words = shlex.split(spec.flag or spec.true_flag or spec.false_flag or "")
            flag = index.flags.get(words[0]) if words else None
            if flag is not None:
                text, site = index.declared_default(flag)
                source = f"{site}: {flag.dest} = {text}"
        entry: dict[str, Any] = {"default": spec.default, "source": source or "not declared in the wheel"}
        because = ((old or {}).get("knobs", {}).get(name) or {}).get("bakeoff_default_because")
        if because:
            entry["bakeoff_default_because"] = because
        knobs[name] = entry
    return {"version": backend.version, "knobs": knobs}
