"""Reading a framework's CLI and config definitions from its wheel, statically: zipfile + ast, never import.

:func:`scan_wheel` walks the ``.py`` files of one wheel and collects what a serving
framework declares about itself, each with the file and line it was read from:

- command-line flags: ``add_argument("--flag", ...)`` calls (their ``default``, ``choices``,
  ``action`` and whether they are deprecated or hidden), and the flags SGLang 0.5.23 derives
  from annotated fields (``A[T, Arg(cli_name=..., aliases=[...])]``, ``--field-name``);
- config fields: annotated class attributes (dataclasses, pydantic models, msgspec
  structs) with their default as source text (``Field(default=X)`` reads as ``X``), and the
  ``Literal[...]`` choice sets of their annotations or of module-level aliases;
- Prometheus metric names: the first argument (or ``name=``) of a ``Counter``, ``Gauge`` or
  ``Histogram`` constructor, or of a ``*_counter_cls``-style factory;
- start-up checks: functions named ``reject_``/``verify_``/``validate_``/``check_...``;
- HTTP routes: string paths given to ``get``/``post``/``api_route``/``add_api_route``/``route``/``mount``.

Only files that can hold one of these are parsed (a byte search first), which keeps a
300 MB wheel to seconds. What the backends render is checked against this in
:mod:`bakeoff.conformance.audit`.
"""

from __future__ import annotations

import ast
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

_METRIC_KINDS = ("counter", "gauge", "histogram")
_ROUTE_METHODS = {"get", "post", "put", "delete", "api_route", "add_api_route", "route", "add_route", "mount", "Mount"}
_MARKERS = (
    b"add_argument", b"Counter", b"Gauge", b"Histogram", b"_cls(", b"Literal[", b"A[", b"dataclass", b"BaseModel",
    b"Struct", b"@config", b'("/', b"('/", b"router", b"@app", b"Mount(", b"CHOICES = [",
)  # fmt: skip
# Files that never define what a server accepts: tests, benchmarks, examples.
_SKIP = re.compile(r"(^|/)(tests?|benchmarks?|examples?)/|(^|/)test_[^/]*\.py$")


@dataclass(frozen=True)
class Site:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Flag:
    """One option string of the framework's argument parser."""

    name: str
    site: Site
    dest: str
    default: str | None = None  # source text of default=, None when not given
    choices: tuple[str, ...] | None = None
    boolean: bool = False  # store_true/false or BooleanOptionalAction: takes no value
    optional_bool: bool = False  # BooleanOptionalAction: --no-NAME parses too
    deprecated: bool = False
    hidden: bool = False


@dataclass(frozen=True)
class ConfigField:
    owner: str
    name: str
    site: Site
    annotation: str
    default: str | None  # source text; None: no default (required)
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    site: Site


@dataclass
class WheelIndex:
    """What one wheel declares: flags by option string, fields by name, metrics, routes."""

    source: str
    flags: dict[str, Flag] = field(default_factory=dict)
    fields: dict[str, list[ConfigField]] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    routes: dict[str, Site] = field(default_factory=dict)
    literals: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # EnableDisableAction (vLLM 0.33): --enable-X pairs with --disable-X, --no-enable-X is hidden.
    enable_disable: bool = False
    # Classes whose add_cli_args turns every field into --field-name (vLLM's FrontendArgs), and bases.
    flag_classes: set[str] = field(default_factory=set)
    bases: dict[str, list[str]] = field(default_factory=dict)
    # Start-up checks (functions named reject_/verify_/validate_/check_...): a new one may
    # refuse a launch that the previous release took.
    validators: dict[str, Site] = field(default_factory=dict)

    def field_of(self, name: str, owner: str | None = None) -> ConfigField | None:
        """The field ``name`` (of ``owner`` when given), following ``Cls.attr`` defaults to their class."""
        candidates = self.fields.get(name, [])
        if owner is not None:
            candidates = [f for f in candidates if f.owner == owner]
        if not candidates:
            return None
        # An engine-args field defaulting to another config class's field reads that one.
        for found in candidates:
            ref = re.fullmatch(r"([A-Z]\w*)\.(\w+)", found.default or "")
            if ref is not None and ref.group(1) != found.owner:
                target = self.field_of(ref.group(2), ref.group(1))
                if target is not None:
                    return target
        return candidates[0]

    def declared_default(self, flag: Flag) -> tuple[str | None, Site]:
        """A flag's default as declared (source text) and where: ``default=Cls.attr`` and ``**kwargs``
        flags read the config field, preferring the class the flag's file fills (EngineArgs, ServerArgs)."""
        ref = re.fullmatch(r"([A-Z]\w*)\.(\w+)", flag.default or "")
        found = self.field_of(ref.group(2), ref.group(1)) if ref is not None else None
        # SGLang 0.5.23: default=_declared_default("name") reads the field of that name.
        named = re.fullmatch(r"_declared_default\(['\"](\w+)['\"]\)", flag.default or "")
        if named is not None:
            ref, found = named, self.field_of(named.group(1))
        if found is None:
            # A **kwargs flag took its default from a config field: cite that field.
            owners = [f.owner for f in self.fields.get(flag.dest, [])]
            resolved = [r for r in (self.field_of(flag.dest, o) for o in owners) if r is not None]
            same = [r for r in resolved if r.default == flag.default]
            found = same[0] if same else None
        return (found.default, found.site) if found is not None else (flag.default, flag.site)

    def metric(self, name: str) -> Metric | None:
        """A metric as scraped: counters are exposed with ``_total`` whether or not the name has it."""
        bare = name.removesuffix("_total")
        return self.metrics.get(name) or self.metrics.get(bare)


def _text(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _strings(node: ast.AST | None) -> tuple[str, ...] | None:
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        values = [_string(e) for e in node.elts]
        return tuple(v for v in values if v is not None) or None
    return None


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg is not None}


def _literal_values(annotation: ast.expr, aliases: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """String values of ``Literal[...]`` anywhere inside an annotation, or of an alias it names."""
    values: list[str] = []
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and _call_name(node.value) == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values += [v for v in (_string(e) for e in elts) if v is not None]
        elif isinstance(node, ast.Name) and node.id in aliases:
            values += aliases[node.id]
    return tuple(values) or None


def _loops_fields(func: ast.FunctionDef) -> bool:
    """An ``add_cli_args`` adding ``f"--{key.replace('_', '-')}"`` for every field of its class."""
    for node in ast.walk(func):
        if isinstance(node, ast.JoinedStr) and node.values and _string(node.values[0]) == "--":
            return True
    return False


def _field_default(value: ast.expr | None) -> str | None:
    """Source text of a field's default; ``Field(default=X)``/``field(default=X)`` read as X."""
    if isinstance(value, ast.Call) and _call_name(value.func) in ("Field", "field", "Arg"):
        kw = _keywords(value)
        if "default" in kw:
            return _text(kw["default"])
        if "default_factory" in kw:
            return f"{_text(kw['default_factory'])}()"
        if not value.args or not isinstance(value.args[0], ast.Constant | ast.Name):
            return None
        return _text(value.args[0])
    return _text(value)


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, index: WheelIndex) -> None:
        self.path = path
        self.index = index
        self.owner: list[str] = []

    def site(self, node: ast.AST) -> Site:
        return Site(self.path, getattr(node, "lineno", 0))

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else node
        target = target.target if isinstance(target, ast.AnnAssign) else target
        if not self.owner and isinstance(target, ast.Name) and node.value is not None:
            value = node.value
            values = _literal_values(value, self.index.literals) if isinstance(value, ast.Subscript) else None
            # A module-level list of strings named as choices= elsewhere (SGLang's QUANTIZATION_CHOICES).
            values = values or _strings(value)
            if values is not None:
                self.index.literals[target.id] = values
        self.generic_visit(node)

    def _choices(self, node: ast.expr | None) -> tuple[str, ...] | None:
        if isinstance(node, ast.Name):
            return self.index.literals.get(node.id)
        return _strings(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name == "EnableDisableAction":
            self.index.enable_disable = True
        self.index.bases[node.name] = [_call_name(b) for b in node.bases]
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "add_cli_args" and _loops_fields(stmt):
                self.index.flag_classes.add(node.name)
        self.owner.append(node.name)
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self._field(node.name, stmt.target.id, stmt)
        self.generic_visit(node)
        self.owner.pop()

    def _field(self, owner: str, name: str, stmt: ast.AnnAssign) -> None:
        annotation = stmt.annotation
        arg_call: ast.Call | None = None
        help_only = False
        # SGLang 0.5.23: name: A[T, "help"] or A[T, Arg(...)] = default makes a CLI flag.
        if isinstance(annotation, ast.Subscript) and _call_name(annotation.value) in ("A", "Annotated"):
            parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            if parts:
                annotation = parts[0]
            meta = parts[1] if len(parts) > 1 else None
            if isinstance(meta, ast.Call) and _call_name(meta.func) == "Arg":
                arg_call = meta
            help_only = _string(meta) is not None
        choices = _literal_values(annotation, self.index.literals)
        if arg_call is not None and "choices" in _keywords(arg_call):
            choices = self._choices(_keywords(arg_call)["choices"]) or choices
        entry = ConfigField(owner, name, self.site(stmt), ast.unparse(annotation), _field_default(stmt.value), choices)
        self.index.fields.setdefault(name, []).append(entry)
        if help_only or arg_call is not None:
            self._field_flags(entry, arg_call)

    def _field_flags(self, entry: ConfigField, arg_call: ast.Call | None) -> None:
        kw = _keywords(arg_call) if arg_call is not None else {}
        no_cli = kw.get("no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            return
        names = [
            _string(kw.get("cli_name")) or "--" + entry.name.replace("_", "-"),
            *(_strings(kw.get("aliases")) or ()),
        ]
        boolean = entry.annotation == "bool" and "action" not in kw
        for name in names:
            flag = Flag(name, entry.site, entry.name, entry.default, entry.choices, boolean=boolean)
            self.index.flags.setdefault(name, flag)

    def _argument(self, node: ast.Call) -> None:
        options = [s for s in (_string(a) for a in node.args) if s is not None and s.startswith("-")]
        if not options:
            return
        kw = _keywords(node)
        action = _string(kw.get("action")) or _call_name(kw["action"]) if "action" in kw else ""
        dest = _string(kw.get("dest")) or options[0].lstrip("-").replace("-", "_")
        deprecated = "deprecated" in action.lower() or (
            isinstance(kw.get("deprecated"), ast.Constant) and getattr(kw["deprecated"], "value", False) is True
        )
        hidden = _text(kw.get("help")) in ("argparse.SUPPRESS", "SUPPRESS")
        optional_bool = action == "BooleanOptionalAction"
        # vLLM passes **kwargs built from the config field: the field decides the type.
        from_field = any(k.arg is None for k in node.keywords)
        config = self.index.field_of(dest) if from_field else None
        boolean = action in ("store_true", "store_false") or "StoreTrue" in action or optional_bool
        if config is not None and config.annotation.replace(" ", "") in ("bool", "bool|None", "Optional[bool]"):
            boolean = optional_bool = True
        choices = self._choices(kw.get("choices")) or (config.choices if config else None)
        default = _text(kw["default"]) if "default" in kw else (config.default if config else None)
        for option in options:
            flag = Flag(option, self.site(node), dest, default, choices, boolean, optional_bool, deprecated, hidden)
            self.index.flags.setdefault(option, flag)


_VALIDATOR = re.compile(r"^_*(reject|verify|validate|check)_\w+")


def _calls(path: str, tree: ast.Module, index: WheelIndex) -> None:
    """Flags, metrics, routes and start-up checks: every call and function of the file, wherever it sits."""
    visitor = _Visitor(path, index)
    named_by_variable: list[str] = []  # kinds of constructors whose name is a variable, not a literal
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and _VALIDATOR.match(node.name):
            index.validators.setdefault(node.name, visitor.site(node))
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node.func)
        lowered = name.lower()
        if name == "add_argument":
            visitor._argument(node)
        elif any(kind in lowered for kind in _METRIC_KINDS) and (name[:1].isupper() or lowered.endswith("_cls")):
            argument = node.args[0] if node.args else _keywords(node).get("name")
            metric = _string(argument)
            kind = next(k for k in _METRIC_KINDS if k in lowered)
            if metric and (":" in metric or "_" in metric):
                index.metrics.setdefault(metric, Metric(metric, kind, visitor.site(node)))
            elif isinstance(argument, ast.Name):
                named_by_variable.append(kind)
        elif name in _ROUTE_METHODS and node.args:
            route = _string(node.args[0])
            if route is not None and route.startswith("/"):
                index.routes.setdefault(route, visitor.site(node))
    if len(set(named_by_variable)) == 1:
        _metric_tables(tree, named_by_variable[0], visitor, index)


_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z0-9_]+$")


def _metric_tables(tree: ast.Module, kind: str, visitor: _Visitor, index: WheelIndex) -> None:
    """Metrics made in a loop over ``(name, documentation)`` tuples (vLLM's spec-decode counters).

    Only where every variable-named constructor of the file is of one kind, so the kind is known.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) >= 2:
            name = _string(node.elts[0])
            if name and _METRIC_NAME.match(name):
                index.metrics.setdefault(name, Metric(name, kind, visitor.site(node)))


def _class_flags(index: WheelIndex) -> None:
    """Flags of classes whose fields all become options, inherited ones included."""

    def marked(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in index.flag_classes:
            return True
        return any(marked(b, seen | {name}) for b in index.bases.get(name, []) if b not in seen)

    owners = {name for name in index.bases if marked(name)}
    for fields in index.fields.values():
        for entry in fields:
            if entry.owner not in owners:
                continue
            boolean = entry.annotation.replace(" ", "") in ("bool", "bool|None")
            name = "--" + entry.name.replace("_", "-")
            flag = Flag(name, entry.site, entry.name, entry.default, entry.choices, boolean, optional_bool=boolean)
            index.flags.setdefault(name, flag)


def _wanted(name: str, packages: tuple[str, ...]) -> bool:
    return name.endswith(".py") and name.startswith(packages) and not _SKIP.search(name)


def scan_wheel(path: Path, packages: tuple[str, ...]) -> WheelIndex:
    """Read a wheel's declarations from the ``.py`` files under ``packages`` (e.g. ``("vllm/",)``).

    Three passes over the parsed files: module-level ``Literal`` aliases, then config fields
    (engine-args flags take their type and default from them), then flags, metrics, routes.
    """
    index = WheelIndex(str(path))
    sources: list[tuple[str, ast.Module]] = []
    with zipfile.ZipFile(path) as wheel:
        for name in sorted(n for n in wheel.namelist() if _wanted(n, packages)):
            data = wheel.read(name)
            if not any(marker in data for marker in _MARKERS):
                continue
            try:
                sources.append((name, ast.parse(data, filename=name)))
            except (SyntaxError, ValueError):
                continue  # a template or a file for another Python: not the server's definitions
    for name, tree in sources:
        visitor = _Visitor(name, index)
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                visitor.visit_Assign(node)
    for name, tree in sources:
        _Visitor(name, index).visit(tree)
    _class_flags(index)
    for name, tree in sources:
        _calls(name, tree, index)
    return index
