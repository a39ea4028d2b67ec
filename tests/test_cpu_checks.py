"""Host CPU checks: a knob value a CPU engine's build has no kernels for is refused before start.

vLLM-CPU on a host without AVX-512 loads its AVX2 build, whose attention has no FP8 KV
cache; these tests give the check sample ``/proc/cpuinfo`` files of both kinds of host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.campaign.cells import expand
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.campaign.tune import host_only
from bakeoff.errors import SpecError
from bakeoff.host import cpu_checks
from bakeoff.host.cpu_checks import check_cpu_needs, host_cpu_flags

# Trimmed /proc/cpuinfo of this project's 2-core AMD EPYC (AVX2, no AVX-512) and of a Sapphire Rapids host.
AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2 sha_ni\n\nprocessor\t: 1\n"
AVX512 = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16\n"
AMX_ONLY = "processor\t: 0\nflags\t\t: fpu avx avx2 amx_tile amx_bf16\n"


def _cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_the_flags_come_from_the_first_cpu_and_an_unreadable_file_gives_none(tmp_path: Path) -> None:
    flags = host_cpu_flags(_cpuinfo(tmp_path, AVX2))
    assert flags is not None and {"avx2", "sha_ni"} <= flags and "avx512f" not in flags
    arm = host_cpu_flags(_cpuinfo(tmp_path, "processor\t: 0\nFeatures\t: fp asimd sve\n"))
    assert arm == {"fp", "asimd", "sve"}
    assert host_cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize("backend", ["vllm-cpu", "vllm-cpu-container"])
def test_fp8_kv_cache_needs_avx512_or_amx(backend: str, tmp_path: Path) -> None:
    spec = load_backend(backend)
    avx2 = host_cpu_flags(_cpuinfo(tmp_path, AVX2))
    with pytest.raises(SpecError) as err:
        check_cpu_needs("servers[0].knobs.", spec, {"kv_cache_dtype": "fp8"}, avx2)
    text = str(err.value)
    assert text.startswith("servers[0].knobs.kv_cache_dtype: ") and "FP8 KV cache on CPU requires" in text
    assert "(avx512f avx512vl avx512bw avx512dq) or (amx_tile)" in text and "set kv_cache_dtype: auto" in text
    # What the AVX2 build has is not refused; neither is fp8 where either set of kernels exists.
    check_cpu_needs("", spec, {"kv_cache_dtype": "auto", "max_num_seqs": 4}, avx2)
    for text in (AVX512, AMX_ONLY):
        check_cpu_needs("", spec, {"kv_cache_dtype": "fp8"}, host_cpu_flags(_cpuinfo(tmp_path, text)))
    # No /proc/cpuinfo to read: the server decides.
    check_cpu_needs("", spec, {"kv_cache_dtype": "fp8"}, None)


def test_w4a16_weights_need_the_avx512_build_of_vllm_cpus_kernels(tmp_path: Path) -> None:
    spec = load_backend("vllm-cpu")
    with pytest.raises(SpecError) as err:
        check_cpu_needs("", spec, {"quantization": "w4a16"}, host_cpu_flags(_cpuinfo(tmp_path, AVX2)))
    assert "cpu_gemm_wna16" in str(err.value) and "_C_AVX2" in str(err.value)
    assert "set quantization: none" in str(err.value)
    check_cpu_needs("", spec, {"quantization": "w4a16"}, host_cpu_flags(_cpuinfo(tmp_path, AVX512)))
    # AMX without AVX-512 does not exist; AMX tiles alone are not what the kernel library is built for.
    with pytest.raises(SpecError):
        check_cpu_needs("", spec, {"quantization": "w4a16"}, host_cpu_flags(_cpuinfo(tmp_path, AMX_ONLY)))


def _campaign(servers: list[dict[str, Any]], ladder: dict[str, Any] | None = None) -> CampaignSpec:
    raw: dict[str, Any] = {
        "name": "t",
        "repeats": 1,
        "model": {"path": "/models/m", "context_len": 2048},
        "servers": servers,
        "workloads": [{"kind": "concurrency", "levels": [1], "input_len": 16, "output_len": 8}],
    }
    if ladder is not None:
        raw["ladder"] = ladder
        raw["quality"] = {"prompts": "trained"}
    return CampaignSpec.model_validate(raw)


def test_a_campaign_refuses_what_this_host_cannot_run_and_not_what_runs_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_checks, "CPUINFO", _cpuinfo(tmp_path, AVX2))
    fp8 = {"backend": "vllm-cpu", "label": "fp8", "knobs": {"kv_cache_dtype": "fp8"}}
    with pytest.raises(SpecError, match=r"servers\[1\]\.knobs\.kv_cache_dtype: vllm-cpu .* on this host"):
        expand(_campaign([{"backend": "vllm-cpu", "label": "auto"}, fp8]), None)
    # A server bakeoff does not start runs on its own host.
    assert len(expand(_campaign([{**fp8, "url": "http://10.0.0.9:8000"}]), None)) == 1
    # A ladder step is checked with the knobs it would run with, before the baseline starts.
    ladder = {"steps": [{"name": "fp8-kv", "knobs": {"kv_cache_dtype": "fp8"}}]}
    with pytest.raises(SpecError, match=r"ladder\.steps\[0\] \(fp8-kv\): ladder\.steps\[0\]\.knobs\.kv_cache_dtype"):
        expand(_campaign([{"backend": "vllm-cpu", "label": "base"}], ladder), None)
    monkeypatch.setattr(cpu_checks, "CPUINFO", _cpuinfo(tmp_path, AVX512))
    assert len(expand(_campaign([fp8]), None)) == 1
    assert len(expand(_campaign([{"backend": "vllm-cpu", "label": "base"}], ladder), None)) == 1


def test_a_tune_leaves_out_the_choices_this_host_cannot_run(tmp_path: Path) -> None:
    backend = load_backend("vllm-cpu")
    assert backend.tune is not None and "fp8" in (backend.tune.knobs["kv_cache_dtype"].choices or [])
    avx2 = host_only(backend.tune, backend, host_cpu_flags(_cpuinfo(tmp_path, AVX2)))
    assert avx2.knobs["kv_cache_dtype"].choices == ["auto"]
    assert avx2.knobs["max_num_seqs"] == backend.tune.knobs["max_num_seqs"]  # ranges are left alone
    avx512 = host_only(backend.tune, backend, host_cpu_flags(_cpuinfo(tmp_path, AVX512)))
    assert avx512.knobs["kv_cache_dtype"].choices == ["auto", "fp8"]
