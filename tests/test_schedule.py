"""``bakeoff schedule print``: the schedules parse, run the right steps, and match the checked-in examples."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bakeoff.campaign.recurring import drift_job, parse_every, render, render_drift
from bakeoff.errors import SpecError
from plan_workloads import CLOSED

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "schedules"
# The command that generated examples/schedules (run from the checkout).
ARGS = ["--campaign", "campaigns/cpu-demo.yaml", "--every", "1w"]


def generated(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(REPO)
    return render(Path("campaigns/cpu-demo.yaml"), "1w", workdir="/opt/bakeoff")


def unit_file(text: str) -> configparser.ConfigParser:
    # systemd repeats keys (two ExecStart= lines): keep the parser from refusing them.
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def test_checked_in_examples_are_exactly_what_the_command_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    files = generated(monkeypatch)
    on_disk = {p.relative_to(EXAMPLES).as_posix(): p.read_text() for p in EXAMPLES.rglob("*") if p.is_file()}
    on_disk = {name: body for name, body in on_disk.items() if "-drift." not in name}
    assert on_disk == files, "regenerate: bakeoff schedule print " + " ".join(ARGS) + " --out examples/schedules"
    printed = subprocess.run(
        [sys.executable, "-m", "bakeoff", "schedule", "print", *ARGS],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    for name, body in files.items():
        assert f"==> {name} <==\n{body}" in printed.stdout


def test_the_workflow_runs_compares_and_uploads_on_a_self_hosted_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    workflow = yaml.safe_load(generated(monkeypatch)[".github/workflows/bakeoff-cpu-demo.yml"])
    assert workflow["on"]["schedule"] == [{"cron": "0 3 * * 1"}]
    job = workflow["jobs"]["bakeoff"]
    assert "self-hosted" in job["runs-on"] and "gpu" not in job["runs-on"]
    steps = job["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    runs = [s.get("run", "") for s in steps]
    run_at = next(i for i, r in enumerate(runs) if "campaign run campaigns/cpu-demo.yaml" in r)
    compare_at = next(i for i, r in enumerate(runs) if "compare reports/cpu-demo --baseline baseline" in r)
    assert run_at < compare_at  # a failing compare (a regression) fails the job
    assert "--or-set-baseline" in runs[compare_at]  # the first scheduled run sets the baseline instead of exit 2
    assert "--fresh" in runs[run_at] and "llamacpp" in runs[run_at - 1]  # cpu-demo uses llama.cpp
    upload = steps[-1]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
    assert upload["with"]["path"] == "reports/cpu-demo"


def test_the_systemd_units_parse_and_point_at_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    files = generated(monkeypatch)
    service = unit_file(files["systemd/bakeoff-cpu-demo.service"])
    timer = unit_file(files["systemd/bakeoff-cpu-demo.timer"])
    assert service["Service"]["Type"] == "oneshot" and service["Service"]["KillSignal"] == "SIGINT"
    starts = [line for line in files["systemd/bakeoff-cpu-demo.service"].splitlines() if line.startswith("ExecStart=")]
    assert [s.split()[1] for s in starts] == ["campaign", "compare"]
    assert all(s.removeprefix("ExecStart=").startswith("/opt/bakeoff/") for s in starts)  # absolute, as systemd needs
    assert timer["Timer"]["OnCalendar"] == "Mon *-*-* 03:00:00"
    assert timer["Timer"]["Unit"] == "bakeoff-cpu-demo.service" and timer["Install"]["WantedBy"] == "timers.target"


def test_the_crontab_line_has_five_time_fields_and_no_percent(monkeypatch: pytest.MonkeyPatch) -> None:
    text = generated(monkeypatch)["cron/bakeoff-cpu-demo.crontab"]
    [line] = [x for x in text.splitlines() if x and not x.startswith("#")]
    fields = line.split()
    assert fields[:5] == ["0", "3", "*", "*", "1"] and fields[5:7] == ["flock", "-n"]
    assert "%" not in line  # cron turns % into a newline


@pytest.mark.parametrize(
    ("every", "cron", "calendar"),
    [
        ("1h", "0 * * * *", "*-*-* 00/1:00:00"),
        ("6h", "0 */6 * * *", "*-*-* 00/6:00:00"),
        ("1d", "0 3 * * *", "*-*-* 03:00:00"),
        ("1w", "0 3 * * 1", "Mon *-*-* 03:00:00"),
    ],
)
def test_cadences_in_both_notations(every: str, cron: str, calendar: str) -> None:
    cadence = parse_every(every)
    assert (cadence.cron, cadence.on_calendar) == (cron, calendar)


def test_sunday_is_cron_day_zero() -> None:
    assert parse_every("1w", "22:30", "Sun").cron == "30 22 * * 0"


@pytest.mark.parametrize(
    ("every", "at", "flag"),
    [("5h", "03:00", "--every"), ("2w", "03:00", "--every"), ("1d", "25:00", "--at"), ("weekly", "03:00", "--every")],
)
def test_bad_schedules_name_the_flag(every: str, at: str, flag: str) -> None:
    with pytest.raises(SpecError, match=flag):
        parse_every(every, at)


def test_a_gpu_campaign_asks_for_a_gpu_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    files = render(Path("campaigns/gpu-7b-three-frameworks.yaml"), "1d", workdir="/srv/b")
    [name] = [n for n in files if n.endswith(".yml")]
    workflow = yaml.safe_load(files[name])
    assert workflow["jobs"]["bakeoff"]["runs-on"] == ["self-hosted", "linux", "gpu"]


# --- a new framework release is a config change ----------------------------------------------


def campaign_with_tag(tmp_path: Path, backend: str, tag: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"""\
name: tagged
gpu: true
repeats: 1
model: {{hf_id: org/name, context_len: 4096}}
servers:
  - {{backend: {backend}, label: s, image_tag: {tag}}}
workloads:
  - {{kind: concurrency, levels: [1], input_len: 8, output_len: 8}}
""")
    return path


def test_a_campaign_can_say_latest_and_the_image_follows(tmp_path: Path) -> None:
    from bakeoff.campaign.cells import expand
    from bakeoff.campaign.specs import load_campaign
    from bakeoff.serving.images import floating_tag

    [cell] = expand(load_campaign(campaign_with_tag(tmp_path, "vllm", "latest")), None)
    assert cell.backend.container is not None
    image = cell.backend.container.image
    assert image.endswith(":latest") and floating_tag(image)  # pulled again on every run
    [pinned] = expand(load_campaign(campaign_with_tag(tmp_path, "vllm", "v0.31.0")), None)
    assert pinned.backend.container is not None and pinned.backend.container.image.endswith(":v0.31.0")
    assert not floating_tag(pinned.backend.container.image)


def test_image_tag_on_a_process_backend_is_refused_naming_the_field(tmp_path: Path) -> None:
    from bakeoff.campaign.cells import expand
    from bakeoff.campaign.specs import load_campaign

    path = campaign_with_tag(tmp_path, "llamacpp", "latest")
    path.write_text(path.read_text().replace("gpu: true\n", ""))
    with pytest.raises(SpecError, match=r"servers\[0\].image_tag: backend 'llamacpp' runs as a process"):
        expand(load_campaign(path), None)


def test_a_bad_tag_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from bakeoff.campaign.specs import load_campaign

    with pytest.raises(SpecError, match=r"servers.0.image_tag"):
        load_campaign(campaign_with_tag(tmp_path, "vllm", "'bad tag!'"))


def test_the_digest_that_ran_is_in_every_run_and_cell_record(tmp_path: Path) -> None:
    from bakeoff.backends.launch_render import RenderedLaunch
    from bakeoff.backends.server_config import ServerConfig
    from bakeoff.backends.spec import load_backend
    from bakeoff.campaign.cell_run import _static_effort
    from bakeoff.campaign.cells import Cell
    from bakeoff.campaign.runner import RunTarget, execute_plan
    from bakeoff.measure.client import ClientSettings
    from bakeoff.results.store import RUN_INFO, read_json
    from bakeoff.serving.handle import ServerHandle
    from bakeoff.serving.reference import serve_reference
    from bakeoff.workloads.kinds import ConcurrencySweep
    from bakeoff.workloads.plans import PlannedRequest, RunPlan

    backend = load_backend("vllm")
    cell = Cell(ServerConfig(backend="vllm"), backend, ConcurrencySweep(levels=[1], input_len=8, output_len=8))
    handle = ServerHandle("http://h:1", "m", tmp_path / "log", "docker run", 1.0, "container",
                          image="vllm/vllm-openai:latest", image_digest="sha256:abc")  # fmt: skip
    effort = _static_effort(cell, RenderedLaunch(backend, ["x"], {}, None, {}), handle)
    # cell.json keeps effort["server"]; each run gets it as its server (as _run_plans passes it), and
    # run.json and the summary's provenance carry the digest on: a run measured against the reference server.
    assert effort["server"]["image"] == "vllm/vllm-openai:latest" and effort["server"]["image_digest"] == "sha256:abc"
    plan = RunPlan("c1", "closed", CLOSED, concurrency=1, requests=[PlannedRequest(0, "completions", 4, prompt="a b")])
    with serve_reference(ttft_ms=1, itl_ms=1) as url:
        settings = ClientSettings(base_url=url, model="bakeoff-ref")
        summary = execute_plan(plan, RunTarget(settings, server_info=dict(effort["server"])), tmp_path / "run")
    assert summary.requests.ok == 1
    assert (summary.provenance.image, summary.provenance.image_digest) == ("vllm/vllm-openai:latest", "sha256:abc")
    assert read_json(tmp_path / "run" / RUN_INFO)["server"]["image_digest"] == "sha256:abc"


def test_floating_tags_are_pulled_again_pinned_ones_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    from bakeoff.serving import images

    calls: list[tuple[str, ...]] = []

    def fake_inspect(runtime: str, image: str, *, build: str | None = None, missing_ok: bool = False) -> object:
        calls.append(("inspect", image))
        return images.ImageInfo(image=image, digest="sha256:new", build_s=None, present=True)

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def fake_cli(runtime: str, *args: str, timeout_s: float = 0) -> Done:
        calls.append(args)
        return Done()

    monkeypatch.setattr(images, "inspect_image", fake_inspect)
    monkeypatch.setattr(images, "runtime_cli", fake_cli)
    monkeypatch.setattr(images, "record_image_seconds", lambda *a: None)
    assert images.ensure_image("podman", "vllm/vllm-openai:latest").digest == "sha256:new"
    # present, yet pulled (latest moves), by its fully qualified name (podman without a TTY refuses short ones)
    assert ("pull", "docker.io/vllm/vllm-openai:latest") in calls
    calls.clear()
    images.ensure_image("podman", "vllm/vllm-openai:v0.31.0")
    assert all(c[0] != "pull" for c in calls)  # a pinned tag already present is used as it is


def test_containers_a_killed_campaign_left_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bakeoff.serving import containers

    removed: list[tuple[str, str]] = []
    monkeypatch.setattr(containers, "remove_container", lambda runtime, ref: removed.append((runtime, ref)))
    record = tmp_path / "cells" / "a__w" / containers.CONTAINER_FILE
    record.parent.mkdir(parents=True)
    record.write_text("podman bakeoff-vllm-8000-abcd1234\n")
    assert containers.reap_containers(tmp_path / "cells") == ["bakeoff-vllm-8000-abcd1234"]
    assert removed == [("podman", "bakeoff-vllm-8000-abcd1234")] and not record.exists()


# --- the drift audit ---------------------------------------------------------------------


def test_the_drift_examples_are_what_the_command_prints() -> None:
    files = render_drift("1w", workdir="/opt/bakeoff")
    on_disk = {p.relative_to(EXAMPLES).as_posix(): p.read_text() for p in EXAMPLES.rglob("*-drift.*")}
    assert on_disk == files, "regenerate: bakeoff schedule print --drift --every 1w --out examples/schedules"


def test_the_drift_job_audits_every_backend_with_a_wheel_against_the_newest_release() -> None:
    from bakeoff.backends.spec import list_backends, load_backend

    job = drift_job()
    with_wheel = {n for n in list_backends() if (a := load_backend(n).audit) is not None and a.distribution}
    assert {b for b, _ in job.audits} == with_wheel and {"vllm", "sglang"} <= with_wheel
    assert "trtllm" not in with_wheel  # no public wheel: the pre-flight covers it
    for (backend, dist), command in zip(job.audits, job.commands, strict=True):
        # A bare distribution (no ==version) is the newest release; only a missing name fails the job.
        assert command.endswith(f"audit {backend} --wheel {dist} --missing-only")
    workflow = yaml.safe_load(render_drift("1w", workdir="/w")[".github/workflows/bakeoff-drift.yml"])
    steps = workflow["jobs"]["audit"]["steps"]
    audits = [s for s in steps if "audit" in s.get("run", "")]
    assert len(audits) == len(job.audits) and all(s["if"] == "always()" for s in audits)
    assert workflow["on"]["schedule"] == [{"cron": "0 3 * * 1"}]
