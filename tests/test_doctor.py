"""Tests of ``bakeoff doctor`` (bakeoff.doctor, bakeoff.campaign.doctor_run) against recorded hosts.

The recorded host (tests/data/doctor/h100x8-docker) is an 8x H100 docker host with the NVIDIA
runtime: ``nvidia-smi``, ``nvidia-smi --query-gpu=... --format=csv`` and ``docker info --format
json`` as those tools print them. Each finding of issue [17] is a variant of it, made here, and
must come back as one line naming the field and the fix. The model folders under
tests/data/doctor/models hold the configs and tokenizer files of checkpoints that fit the shipped
GPU campaigns (no weights).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.campaign.doctor_run import doctor_servers, run_doctor
from bakeoff.campaign.specs import load_campaign
from bakeoff.cli.main import main
from bakeoff.doctor.diagnose import DoctorServer, diagnose
from bakeoff.doctor.host import HostOutputs, parse_gpu_query, read_recorded
from bakeoff.doctor.model_checks import model_context
from bakeoff.doctor.problems import Problem, errors
from bakeoff.serving.containers import container_run_args, render_container_launch
from bakeoff.serving.runtime_facts import parse_podman_info

DATA = Path(__file__).parent / "data" / "doctor"
H100_DOCKER = DATA / "h100x8-docker"
MODELS = DATA / "models"
CAMPAIGNS = Path(__file__).parent.parent / "campaigns"
GPU_CAMPAIGNS = sorted(CAMPAIGNS.glob("gpu-*.yaml"))


def _host(tmp_path: Path, **change: object) -> HostOutputs:
    """The recorded H100 host, changed: the variant a test describes (``tmp_path``: where it could be recorded)."""
    host = read_recorded(H100_DOCKER)
    for name, value in change.items():
        setattr(host, name, value)
    return host


def _rootless_podman(tmp_path: Path, *, cdi: bool = True) -> HostOutputs:
    specs = {"/etc/cdi/nvidia.yaml": (DATA / "cdi-nvidia.yaml").read_text()} if cdi else {}
    return _host(
        tmp_path,
        infos={"podman": (DATA / "podman-info-rootless.json").read_text()},
        cdi_specs=specs,
        hard_limits={"memlock": 8 * 1024 * 1024, "stack": -1, "nofile": 524288},
    )


def _campaign_servers(name: str, models: Path = MODELS) -> list[DoctorServer]:
    """A shipped campaign's servers with its /models/... folders read from ``models``."""
    spec = load_campaign(CAMPAIGNS / f"{name}.yaml")
    servers = []
    for server in doctor_servers(spec):
        assert server.model_dir is not None and server.model_dir.is_relative_to("/models")
        local = models / server.model_dir.relative_to("/models")
        servers.append(DoctorServer(**{**server.__dict__, "model_dir": local}))
    return servers


def _only(problems: list[Problem], field_part: str) -> Problem:
    found = [p for p in problems if field_part in p.field]
    assert len(found) == 1, [p.line() for p in problems]
    return found[0]


def _vllm(
    knobs: dict[str, object], model_dir: Path | None = MODELS / "llama-7b", chat: str | None = None
) -> DoctorServer:
    return DoctorServer("vllm", "servers[0]", load_backend("vllm"), dict(knobs), model_dir, "model.path", {}, chat)  # type: ignore[arg-type]


# --- the recorded host -----------------------------------------------------------------


def test_the_recorded_host_reads_as_eight_h100s_on_docker_with_the_nvidia_runtime(tmp_path: Path) -> None:
    facts = _host(tmp_path).facts()
    assert facts.cuda == (13, 0)
    assert [g.index for g in facts.gpus] == list(range(8))
    assert {(g.name, g.compute_capability, g.memory_total_mib) for g in facts.gpus} == {
        ("NVIDIA H100 80GB HBM3", 9.0, 81559)
    }
    [docker] = facts.runtimes
    assert docker.name == "docker" and docker.nvidia_runtime and not docker.rootless and docker.gpu_ready()


def test_a_recorded_host_round_trips_through_record(tmp_path: Path) -> None:
    host = _rootless_podman(tmp_path)
    host.record(tmp_path / "again")
    again = read_recorded(tmp_path / "again")
    assert again.facts() == host.facts()


def test_an_error_line_from_nvidia_smi_is_no_gpu() -> None:
    assert parse_gpu_query("index, name\nNVIDIA-SMI has failed because it couldn't communicate with the driver.") == []


@pytest.mark.parametrize("campaign", GPU_CAMPAIGNS, ids=lambda p: p.stem)
def test_the_shipped_gpu_campaigns_pass_on_an_8x_h100_docker_host(campaign: Path, tmp_path: Path) -> None:
    problems = diagnose(_campaign_servers(campaign.stem), _host(tmp_path).facts())
    # The TensorRT-LLM image names ${NGC_REGISTRY}: named by `campaign validate`, not here.
    assert problems == [], [p.line() for p in problems]


# --- one finding each, one line each ---------------------------------------------------


def test_rootless_podman_leaves_out_memlock_and_says_how_to_keep_it(tmp_path: Path) -> None:
    facts = _rootless_podman(tmp_path).facts()
    problems = diagnose(_campaign_servers("gpu-7b-three-frameworks"), facts)
    line = _only(problems, "backends/vllm.yaml container.ulimits memlock=-1")
    assert line.severity == "warning"  # the run goes on, without the flag
    assert "setrlimit RLIMIT_MEMLOCK: Operation not permitted" in line.would
    assert "hard memlock unlimited" in line.fix
    assert not errors(problems), [p.line() for p in problems]
    # ... and the command bakeoff starts on that host leaves it out, keeping the stack limit it can grant.
    [podman] = facts.runtimes
    backend = load_backend("vllm")
    launch = render_container_launch(backend, {}, served_model_name="m")
    args = container_run_args(launch, runtime="podman", port=8001, model_dir=tmp_path, name="x", facts=podman)
    assert "memlock=-1" not in args and "stack=67108864" in args
    rootful = parse_podman_info(json.dumps({"host": {"security": {"rootless": False}}}), podman.cdi)
    assert "memlock=-1" in container_run_args(
        launch, runtime="podman", port=8001, model_dir=tmp_path, name="x", facts=rootful
    )


def test_podman_without_a_cdi_spec_is_told_to_generate_one(tmp_path: Path) -> None:
    problems = diagnose(_campaign_servers("gpu-7b-three-frameworks"), _rootless_podman(tmp_path, cdi=False).facts())
    line = _only(problems, "podman CDI spec")
    assert "--device nvidia.com/gpu=all" in line.would and "nvidia-ctk cdi generate" in line.fix
    assert line.severity == "error"


def test_docker_without_the_nvidia_runtime_is_told_to_configure_it(tmp_path: Path) -> None:
    info = json.loads((H100_DOCKER / "docker-info.json").read_text())
    del info["Runtimes"]["nvidia"]
    problems = diagnose(
        _campaign_servers("gpu-7b-three-frameworks"), _host(tmp_path, infos={"docker": json.dumps(info)}).facts()
    )
    assert "nvidia-ctk runtime configure --runtime=docker" in _only(problems, "docker NVIDIA runtime").fix


def test_a_driver_too_old_for_the_images_cuda_names_the_cuda_12_build(tmp_path: Path) -> None:
    smi = (H100_DOCKER / "nvidia-smi.txt").read_text().replace("CUDA Version: 13.0", "CUDA Version: 12.4")
    problems = diagnose(_campaign_servers("gpu-7b-three-frameworks"), _host(tmp_path, nvidia_smi=smi).facts())
    vllm = _only(problems, "backends/vllm.yaml container.image")
    assert "built for CUDA 13.0 but the host driver supports CUDA 12.4" in vllm.would
    assert vllm.fix.startswith("use docker.io/vllm/vllm-openai:v0.33.0-cu129")
    trtllm = _only(problems, "backends/trtllm.yaml container.image")
    assert "upgrade the NVIDIA driver" in trtllm.fix  # NVIDIA publishes no CUDA 12 build of it


def test_fp8_kv_on_an_sm80_gpu_is_refused_with_vllms_own_reason(tmp_path: Path) -> None:
    csv = (H100_DOCKER / "nvidia-smi-gpus.csv").read_text().replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
    facts = _host(tmp_path, gpu_query=csv.replace(", 9.0, ", ", 8.0, ")).facts()
    line = _only(diagnose([_vllm({"kv_cache_dtype": "fp8"})], facts), "knobs.kv_cache_dtype")
    assert line.field == "servers[0].knobs.kv_cache_dtype (vllm)"
    assert "requires SM89+" in line.would and "compute capability 8.0" in line.would
    assert "compute capability 8.9 or newer" in line.fix
    assert diagnose([_vllm({"kv_cache_dtype": "int8"})], facts) == []  # INT8 KV has no such need


def test_a_model_context_of_4096_under_a_16384_ask_is_refused(tmp_path: Path) -> None:
    line = _only(diagnose([_vllm({"max_model_len": 16384})], _host(tmp_path).facts()), "max_model_len")
    assert "max_model_len 16384 is greater than the model's 4096 (max_position_embeddings" in line.would
    assert line.fix.startswith("set max_model_len to 4096 or less")
    allowed = DoctorServer(
        **{**_vllm({"max_model_len": 16384}).__dict__, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}
    )
    assert diagnose([allowed], _host(tmp_path).facts()) == []


def test_the_context_follows_vllms_rope_rule(tmp_path: Path) -> None:
    assert model_context(MODELS / "llama-3.1-8b-instruct") == (
        131072,
        "max_position_embeddings",
    )  # llama3: counted already
    folder = tmp_path / "linear"
    folder.mkdir()
    config = {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}
    (folder / "config.json").write_text(json.dumps(config))
    assert model_context(folder) == (8192, "max_position_embeddings x rope_scaling.factor 2.0")


def test_a_checkpoint_without_a_chat_template_is_refused_where_chat_is_used(tmp_path: Path) -> None:
    folder = tmp_path / "base-model"
    shutil.copytree(MODELS / "llama-7b", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    line = _only(diagnose([_vllm({}, folder, chat="quality.endpoint (chat)")], _host(tmp_path).facts()), "model.path")
    assert "HTTP 400" in line.would and "no chat template" in line.would
    assert diagnose([_vllm({}, folder)], _host(tmp_path).facts()) == []  # completions only: no template needed


def test_a_short_image_name_is_told_its_fully_qualified_name(tmp_path: Path) -> None:
    backend = load_backend("vllm")
    assert backend.container is not None
    short = backend.model_copy(
        update={"container": backend.container.model_copy(update={"image": "vllm/vllm-openai:v0.33.0"})}
    )
    server = DoctorServer("vllm", "servers[0]", short, {}, MODELS / "llama-7b", "model.path")
    line = _only(diagnose([server], _rootless_podman(tmp_path).facts()), "container.image")
    assert line.severity == "error"  # podman refuses it without a TTY
    assert line.fix == "write it fully qualified: docker.io/vllm/vllm-openai:v0.33.0"
    assert _only(diagnose([server], _host(tmp_path).facts()), "container.image").severity == "warning"  # docker


def test_two_tokenizers_in_one_campaign_are_refused(tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(MODELS, models)
    (models / "llama-7b-modelopt-w4a16-awq" / "tokenizer.json").write_text('{"model": {"vocab": {"b": 1}}}\n')
    problems = diagnose(_campaign_servers("gpu-7b-awq-int4", models), _host(tmp_path).facts())
    line = _only(problems, "servers[2].model_path")
    assert "tokenizer differs" in line.would and "different number of tokens" in line.would


def test_the_shipped_rag_campaign_on_the_7b_model_is_refused_at_every_server(tmp_path: Path) -> None:
    # What gpu-rag-8k did before: the 4,096-token 7B under a 16,384-token ask.
    models = tmp_path / "models"
    models.mkdir()
    (models / "llama-3.1-8b-instruct").symlink_to(MODELS / "llama-7b")
    problems = diagnose(_campaign_servers("gpu-rag-8k", models), _host(tmp_path).facts())
    assert [p.field for p in problems] == [
        f"servers[{i}].knobs.max_model_len ({label})"
        for i, label in enumerate(("vllm-chunked", "vllm-unchunked", "sglang-chunked", "trtllm-chunked"))
    ]


def test_other_processes_on_a_gpu_stop_vllm_below_its_memory_share(tmp_path: Path) -> None:
    csv = (
        (H100_DOCKER / "nvidia-smi-gpus.csv")
        .read_text()
        .replace(
            "0, NVIDIA H100 80GB HBM3, 580.95.05, 9.0, 81559 MiB, 81080 MiB",
            "0, NVIDIA H100 80GB HBM3, 580.95.05, 9.0, 81559 MiB, 61080 MiB",
        )
    )
    line = _only(diagnose([_vllm({})], _host(tmp_path, gpu_query=csv).facts()), "gpu_memory_utilization")
    assert "less than gpu_memory_utilization 0.92" in line.would and "0.74 or less" in line.fix


def test_too_little_disk_for_the_images(tmp_path: Path) -> None:
    host = _host(tmp_path, disk_free={"/var/lib/docker": 40 << 30})
    line = _only(diagnose(_campaign_servers("gpu-7b-three-frameworks"), host.facts()), "image store")
    assert "40 GiB free" in line.would


# --- the command and the campaign run ----------------------------------------------------


def test_the_cli_prints_one_line_per_problem_and_fails_on_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rootless_podman(tmp_path, cdi=False).record(tmp_path / "rec")
    code = main(["doctor", "--host-from", str(tmp_path / "rec")])
    out = capsys.readouterr().out
    assert code == 1
    assert "host: podman CDI spec: podman would refuse --device nvidia.com/gpu=all" in out
    assert out.splitlines()[-1] == "this host: 1 problem would stop a run"


def test_campaign_run_stops_before_any_pull_on_a_doctor_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bakeoff.campaign import execute

    host = _rootless_podman(tmp_path, cdi=False)
    monkeypatch.setattr("bakeoff.campaign.doctor_run.read_live", lambda: host)

    def no_prepare(*args: object, **kwargs: object) -> None:
        raise AssertionError("prepare (plans, pre-flight, pulls) ran after a doctor error")

    monkeypatch.setattr(execute, "prepare", no_prepare)
    from bakeoff.errors import SpecError

    with pytest.raises(SpecError, match="bakeoff doctor found"):
        execute.run_campaign(CAMPAIGNS / "gpu-7b-three-frameworks.yaml", out_dir=tmp_path / "out")
    assert run_doctor(CAMPAIGNS / "cpu-demo.yaml", host) == []  # CPU campaigns are not the doctor's


def test_a_ray_campaign_stops_before_any_task_on_a_doctor_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bakeoff.cluster import ray_runner
    from bakeoff.cluster.ray_store import ResultStore
    from bakeoff.errors import SpecError

    host = _rootless_podman(tmp_path, cdi=False)
    monkeypatch.setattr("bakeoff.campaign.doctor_run.read_live", lambda: host)

    def no_prepare(*args: object, **kwargs: object) -> None:
        raise AssertionError("prepare (plans, pulls) ran after a doctor error")

    monkeypatch.setattr(ray_runner, "prepare", no_prepare)
    results = ResultStore.open(None, tmp_path / "out")
    # Ray itself is never reached: the doctor stops the run on the driver first.
    with pytest.raises(SpecError, match="bakeoff doctor found"):
        ray_runner.run_cells_on_ray(object(), CAMPAIGNS / "gpu-7b-three-frameworks.yaml", results)  # type: ignore[arg-type]
