"""Campaigns on Ray: cells as tasks in parallel, a lost worker's cell retried, results in one store.

A local Ray cluster started here (4 CPUs, a fake accelerator resource) runs campaigns
whose servers are the reference server as a process backend, as the resume tests do.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
import ray

import test_tune as planted
from bakeoff.analysis.verdict import auto_repeats_note, verdicts
from bakeoff.campaign import cells as campaign_cells
from bakeoff.campaign import execute as campaign
from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.cell_spec import write_cell_spec
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.cli.main import main
from bakeoff.cluster.ray_runner import (
    RETRY_REASON,
    TRIES,
    cell_options,
    check_ray_fields,
    connect,
    run_cells_on_ray,
)
from bakeoff.cluster.ray_store import ResultStore
from bakeoff.cluster.ray_tune import tune_campaign_ray
from bakeoff.report import cluster as report_cluster
from bakeoff.report import tables as report
from bakeoff.results.layout import AUTO_REPEATS
from bakeoff.results.store import read_json, read_summary, write_json

REPO = Path(__file__).resolve().parents[1]
SERVED = f"ray-test-{uuid.uuid4().hex[:8]}"  # names this module's servers among everyone's
TTFT_MS, ITL_MS = 40.0, 20.0  # the reference server's planted schedule
BACKEND = f"""\
name: refproc
display_name: reference server (test)
runtime: process
accelerator: cpu
command: ["{{python}}", "-m", "bakeoff.ref.server", "--port", "{{port}}", "--model", "{{served_model_name}}",
          "--ttft-ms", "{TTFT_MS:g}", "--itl-ms", "{ITL_MS:g}"]
health: {{path: /health, timeout_s: 20, interval_s: 0.1}}
cache_reset: {{kind: none}}
"""


def campaign_yaml(
    model: Path, requests: int, extra: str = "repeats: 1\n", second: str = "refproc", warmup: int = 0
) -> str:
    return f"""\
name: ray-test
model: {{path: {model}, served_name: {SERVED}}}
servers:
  - {{backend: refproc, label: a}}
  - {{backend: {second}, label: b}}
workloads:
  - {{kind: concurrency, name: w, levels: [2], requests_per_level: {requests}, warmup_requests: {warmup},
      input_len: 16, output_len: 16}}
measure_warm_restart: false
{extra}"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray cluster whose workers find the test backend (they inherit this environment)."""
    root = tmp_path_factory.mktemp("ray")
    (root / "backends").mkdir()
    (root / "backends" / "refproc.yaml").write_text(BACKEND)
    before = os.environ.get("BAKEOFF_BACKENDS_DIR")
    os.environ["BAKEOFF_BACKENDS_DIR"] = str(root / "backends")
    # Started as bakeoff starts a local cluster (its start-up waits and retries), once for the module.
    # Eight fake GPUs: Ray places GPU tasks on them (CUDA_VISIBLE_DEVICES per task) as on an 8-GPU host.
    assert connect(ray, None, {}, num_cpus=4, num_gpus=8, resources={"accelerator_type:FAKE": 2})
    try:
        yield root
    finally:
        ray.shutdown()
        if before is None:
            os.environ.pop("BAKEOFF_BACKENDS_DIR", None)
        else:
            os.environ["BAKEOFF_BACKENDS_DIR"] = before


def our_servers() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if "bakeoff.ref.server" in line and SERVED in line:
            found.append(proc)
    return found


def window(cell_dir: Path) -> tuple[str, str]:
    info = read_json(cell_dir / "runs" / "c2" / "run.json")
    return info["started_at"], info["finished_at"]


def test_cells_run_in_parallel_on_ray_into_an_object_store_and_match_the_serial_path(
    cluster: Path, tiny_model: Path
) -> None:
    path = cluster / "parallel.yaml"
    path.write_text(campaign_yaml(tiny_model, 12))
    store = ResultStore(cluster / "mirror", (cluster / "bucket").as_uri())  # file:// goes through fsspec
    assert run_cells_on_ray(ray, path, store) == []
    # The store holds every cell, whole; the driver's copy was pulled from it.
    for cell in ("a__w", "b__w"):
        assert (cluster / "bucket" / "cells" / cell / "runs" / "c2" / "summary.json").is_file()
        info = read_json(store.local / "cells" / cell / "cell.json")
        assert info["status"] == "ok" and info["ray"]["retried"] == 0 and len(info["ray"]["tries"]) == 1
        summary = read_summary(store.local / "cells" / cell / "runs" / "c2" / "summary.json")
        assert summary.provenance.node_id == ray.get_runtime_context().get_node_id()
        assert summary.requests.ok == 12 and summary.client is not None and summary.client.processes == 1
    (a0, a1), (b0, b1) = window(store.local / "cells" / "a__w"), window(store.local / "cells" / "b__w")
    assert a0 < b1 and b0 < a1, f"cells ran one after the other: a {a0}..{a1}, b {b0}..{b1}"
    # The serial path (what the local campaign's notebook calls) measures the same server: each one
    # against the planted schedule, which load can only delay (the two ran under different loads).
    serial = cluster / "serial"
    spec, [serial_cell] = campaign_cells.prepare(path, serial, ["a"])
    campaign.run_cell(write_cell_spec(serial, spec, serial_cell))
    here = read_summary(serial / "cells" / "a__w" / "runs" / "c2" / "summary.json").latency
    there = read_summary(store.local / "cells" / "a__w" / "runs" / "c2" / "summary.json").latency
    for where, latency in (("on Ray", there), ("serial", here)):
        assert latency.ttft_ms.mean is not None and latency.tpot_ms.mean is not None, where
        # A timer may fire within its millisecond; nothing else makes a reading faster than the schedule.
        assert latency.ttft_ms.mean >= TTFT_MS - 1, (where, latency.ttft_ms.mean)
        assert latency.tpot_ms.mean >= ITL_MS - 1, (where, latency.tpot_ms.mean)
    assert not our_servers()


def test_a_ray_rehearsal_on_an_8_gpu_host_pins_two_cells_to_different_gpus(cluster: Path, tiny_model: Path) -> None:
    # Two GPU servers rehearsed as Ray tasks: each task gets its GPU from Ray, and the container
    # command the GPU host would run names that GPU and no other.
    for name in ("vllm", "sglang"):
        shutil.copy(REPO / "backends" / f"{name}.yaml", cluster / "backends" / f"{name}.yaml")
    path = cluster / "pinned.yaml"
    path.write_text(
        f"name: pinned\nmodel: {{path: /models/llama-7b, served_name: {SERVED}}}\ngpu: true\n"
        "servers: [{backend: vllm, label: v}, {backend: sglang, label: s}]\n"
        "workloads: [{kind: concurrency, name: w, levels: [1], input_len: 16, output_len: 8}]\n"
    )
    store = ResultStore(cluster / "pinned-out", None)
    assert run_cells_on_ray(ray, load_input(path, rehearse=True), store) == []
    pinned = {}
    for cell in ("v__w", "s__w"):
        server = read_json(store.local / "cells" / cell / "cell.json")["effort"]["server"]
        devices = server["gpus"]["devices"]
        assert len(devices) == 1 and "CUDA_VISIBLE_DEVICES" in server["gpus"]["source"]
        command = server["command_line"]
        assert f"nvidia.com/gpu={devices[0]}" in command or f"device={devices[0]}" in command
        assert "gpu=all" not in command and "--gpus all" not in command
        pinned[cell] = devices[0]
    assert pinned["v__w"] != pinned["s__w"], pinned
    assert not our_servers()


def test_a_killed_worker_fails_only_its_cell_which_is_retried_reported_and_never_loses_a_finished_run(
    cluster: Path, tiny_model: Path
) -> None:
    path = cluster / "kill.yaml"
    path.write_text(campaign_yaml(tiny_model, 24, "repeats: 1\nray: {max_retries: 2}\n"))
    store = ResultStore(cluster / "shared")  # a folder every node mounts
    outcome: dict[str, Any] = {}

    def drive() -> None:
        try:
            outcome["failures"] = run_cells_on_ray(ray, path, store)
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    driver = threading.Thread(target=drive)
    driver.start()
    journal = store.local / "cells" / "a__w" / "runs" / "c2" / "records.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.is_file() and len(journal.read_bytes().splitlines()) >= 3):
        assert time.monotonic() < deadline and driver.is_alive(), f"cell a never got going: {outcome}"
        time.sleep(0.05)
    worker = read_json(store.local / "cells" / "a__w" / TRIES)["tries"][-1]["pid"]
    os.kill(worker, signal.SIGKILL)
    driver.join(120)
    assert not driver.is_alive() and "error" not in outcome, outcome
    assert outcome["failures"] == []
    a = read_json(store.local / "cells" / "a__w" / "cell.json")
    assert a["status"] == "ok" and a["ray"]["retried"] == 1
    assert [t["outcome"] for t in a["ray"]["tries"]] == ["lost", "ok"]
    [earlier] = a["earlier_attempts"]
    assert earlier["why_measured_again"].startswith(RETRY_REASON) and earlier["finished_requests"] >= 3
    assert read_summary(store.local / "cells" / "a__w" / "runs" / "c2" / "summary.json").requests.ok == 24
    # The other cell ran once, untouched by its neighbour's loss.
    b = read_json(store.local / "cells" / "b__w" / "cell.json")
    assert b["status"] == "ok" and b["ray"]["retried"] == 0 and not b["earlier_attempts"]
    rows = report.remeasured_table(store.local)
    assert list(rows["cell"]) == ["a__w"] and RETRY_REASON in rows["measured again because"].iloc[0]
    placed = report_cluster.placement_table(store.local).set_index("cell")
    assert placed.loc["a__w", "tries"] == 2 and placed.loc["b__w", "tries"] == 1
    assert placed.loc["a__w", "retried after a lost worker on"] and placed.loc["b__w", "host"]
    clients = report_cluster.client_table(store.local)
    assert list(clients["client processes"]) == [1, 1] and clients["headroom %"].between(0, 100).all()
    assert not our_servers(), "the lost try's server was left running"
    # Run again: finished cells are skipped, not re-run.
    finished = {c: read_json(store.local / "cells" / c / "cell.json")["finished_at"] for c in ("a__w", "b__w")}
    assert run_cells_on_ray(ray, path, store) == []
    assert finished == {c: read_json(store.local / "cells" / c / "cell.json")["finished_at"] for c in finished}


def test_auto_repeats_on_ray_stop_after_the_deciding_round_and_never_queue_a_later_one(
    cluster: Path, tiny_model: Path
) -> None:
    # b streams four times as fast as a (a token every 5 ms against 20): decided at the first look
    # (round 2) on a quiet host; on 2 loaded cores the two runs of a side can differ by a third,
    # and with n = 2 a side that once left the first look undecided (a 2x gap needed round 3 more
    # often). What is asserted is the stop: the rounds taken are every round that ran, and none
    # after the deciding one was queued. Four warm-up requests a run: without them the fast server's
    # first run (its first requests ever, a token every 5 ms) measured 105-143 tok/s against 255-267 in
    # every later round, twice in CI, which left the gap undecided until round 4 or 5. At most 5 rounds,
    # so that a late decision still leaves a round that must not be queued.
    fast = BACKEND.replace("name: refproc", "name: reffast").replace(f'"{ITL_MS:g}"]', '"5"]')
    (cluster / "backends" / "reffast.yaml").write_text(fast)  # where the workers look
    path = cluster / "auto.yaml"
    # 16 requests a run, not 8: with 8 at concurrency 2, a steady window of a handful of requests left
    # the 4x gap undecided after 4 rounds on a loaded host (four workers on 2 cores).
    path.write_text(
        campaign_yaml(tiny_model, 16, "repeats: auto\nmin_repeats: 2\nmax_repeats: 5\n", "reffast", warmup=4)
    )
    store = ResultStore(cluster / "auto")
    assert run_cells_on_ray(ray, path, store) == []
    out = store.local
    # The folder says what a serial run says: the rounds taken and why it stopped.
    stopped = read_json(out / AUTO_REPEATS)
    taken = stopped["rounds"]
    assert taken in (2, 3, 4), stopped
    assert stopped == {"rounds": taken, "max_repeats": 5, "why": "every verdict decided", "undecided": []}
    note = auto_repeats_note(out)
    assert note is not None and f"{taken} round(s) of at most 5: every verdict decided" in note
    (found,) = verdicts(out)
    assert found.levels[2.0].winner == "b"
    # No round after the deciding one was queued: no cell of theirs has a folder, let alone a run.
    rounds = [[f"{c}__r{r}" if r > 1 else c for c in ("a__w", "b__w")] for r in range(1, taken + 1)]
    assert sorted(p.name for p in (out / "cells").iterdir()) == sorted(c for cells in rounds for c in cells)
    info = {c: read_json(out / "cells" / c / "cell.json") for cells in rounds for c in cells}
    assert all(i["status"] == "ok" for i in info.values())
    # Each round was queued only once the one before had finished (the look between them).
    for before, after in itertools.pairwise(rounds):
        assert max(info[c]["finished_at"] for c in before) <= min(info[c]["started_at"] for c in after)
    assert not our_servers()


def gpu_cells(
    tmp_path: Path, servers: str, *, rehearse: bool = False
) -> tuple[CampaignSpec, list[campaign_cells.Cell]]:
    spec = CampaignSpec.model_validate_json(
        "{"
        f'"name": "g", "gpu": true, "gpu_type": "A100", "model": {{"path": "{tmp_path}", "context_len": 4096}},'
        f'"servers": {servers},'
        '"workloads": [{"kind": "concurrency", "levels": [1], "input_len": 8, "output_len": 8}]'
        "}"
    )
    cells = campaign_cells.expand(spec, None)
    return spec, campaign_cells.rehearsal_cells(cells) if rehearse else cells


def test_cell_resources_follow_tensor_parallelism_gpu_type_and_engine_kind(tmp_path: Path) -> None:
    servers = (
        '[{"backend": "vllm", "label": "tp2", "knobs": {"tensor_parallel_size": 2}, "gpu_type": "H100"},'
        ' {"backend": "sglang", "label": "any"}, {"backend": "llamacpp", "label": "cpu"}]'
    )
    spec, cells = gpu_cells(tmp_path, servers)
    options = {c.server.label: cell_options(c, spec) for c in cells}
    assert options["tp2"]["num_gpus"] == 2 and options["tp2"]["resources"] == {"accelerator_type:H100": 0.001}
    assert options["any"]["num_gpus"] == 1 and options["any"]["resources"] == {"accelerator_type:A100": 0.001}
    assert "num_gpus" not in options["cpu"] and options["cpu"]["num_cpus"] == 2
    assert options["tp2"]["num_cpus"] == 1 and options["tp2"]["max_retries"] == 2
    assert options["tp2"]["retry_exceptions"] is False
    # A rehearsal's stand-ins are reference servers: they hold no GPU, unless the cluster has some
    # (then they take their server's share, so the rendered commands show Ray's placement).
    spec, rehearsed = gpu_cells(tmp_path, servers, rehearse=True)
    assert all("num_gpus" not in cell_options(c, spec) for c in rehearsed)
    on_gpus = {c.server.label: cell_options(c, spec, cluster_has_gpus=True) for c in rehearsed}
    assert on_gpus["tp2"]["num_gpus"] == 2 and "num_gpus" not in on_gpus["cpu"]


def test_gpu_type_on_a_cpu_server_is_refused_naming_the_field(tmp_path: Path) -> None:
    spec, cells = gpu_cells(tmp_path, '[{"backend": "vllm"}, {"backend": "llamacpp", "gpu_type": "H100"}]')
    with pytest.raises(Exception, match=r"servers\[1\]\.gpu_type: llamacpp runs on CPU"):
        check_ray_fields(spec, cells)


def test_ray_flag_without_ray_says_how_to_install_it(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(campaign_yaml(tiny_model, 4))
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    assert main(["campaign", "run", str(path), "--ray", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Ray is not installed" in err and "pip install 'bakeoff[ray]'" in err
    assert not (tmp_path / "out" / "cells").exists()  # refused before anything ran


class FlakyRay:
    """Ray's init as a busy host makes it: the first ``fails`` starts time out as Ray's node start does."""

    def __init__(self, fails: int, error: str = "The current node timed out during startup.") -> None:
        self.fails, self.error, self.inits, self.shutdowns = fails, error, 0, 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        if self.inits <= self.fails:
            raise Exception(self.error)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_local_ray_start_that_timed_out_is_tried_again_then_refused_with_the_cause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bakeoff.cluster.ray_runner import LOCAL_START_TRIES
    from bakeoff.errors import LaunchError

    once = FlakyRay(fails=1)
    assert connect(once, None, {}) and once.inits == 2 and once.shutdowns == 1  # type: ignore[arg-type]
    assert "Ray's local start, try 1 of" in capsys.readouterr().err
    never = FlakyRay(fails=LOCAL_START_TRIES)
    with pytest.raises(LaunchError, match="dashboard agent 15 s"):
        connect(never, None, {})  # type: ignore[arg-type]
    assert never.inits == LOCAL_START_TRIES
    other = FlakyRay(fails=1, error="object_store_memory is too large")  # not a deadline: not retried
    with pytest.raises(Exception, match="too large"):
        connect(other, None, {})  # type: ignore[arg-type]
    assert other.inits == 1


def test_object_store_pushes_summaries_then_cell_json_last_and_pulls_back(tmp_path: Path) -> None:
    cell = tmp_path / "local" / "cells" / "x"
    for run in ("r1", "r2"):
        (cell / "runs" / run).mkdir(parents=True)
        for name in ("summary.json", "records.parquet", "run.json"):
            write_json(cell / "runs" / run / name, {"run": run, "file": name})
    write_json(cell / "cell.json", {"status": "ok"})
    store = ResultStore(tmp_path / "local", (tmp_path / "bucket").as_uri())
    order: list[str] = []
    put = store._fs.put_file
    store._fs.put_file = lambda src, dst, **kw: (order.append(Path(src).relative_to(cell).as_posix()), put(src, dst))
    store.push(cell, "cells/x")
    assert order[-1] == "cell.json"
    for run in ("r1", "r2"):
        assert order.index(f"runs/{run}/summary.json") > order.index(f"runs/{run}/records.parquet")
    assert not [p for p in (tmp_path / "bucket").rglob("*") if ".part-" in p.name]
    assert store.pull("cells/x", tmp_path / "copy") == 7
    assert read_json(tmp_path / "copy" / "runs" / "r2" / "run.json") == {"run": "r2", "file": "run.json"}


def test_a_misspelt_ray_policy_key_is_named_with_the_valid_ones(tmp_path: Path, tiny_model: Path) -> None:
    from bakeoff.campaign.specs import load_campaign
    from bakeoff.errors import SpecError

    path = tmp_path / "c.yaml"
    path.write_text(campaign_yaml(tiny_model, 4, "repeats: 1\nray: {max_retrys: 2}\n"))
    with pytest.raises(SpecError, match=r"ray\.max_retrys: unknown key.*max_retries, retry_exceptions, cpus_per_cell"):
        load_campaign(path)


def test_a_tune_on_ray_measures_every_cell_as_a_task_and_keeps_its_study_in_the_folder(
    cluster: Path, tiny_model: Path
) -> None:
    root = cluster / "tune"
    root.mkdir()
    canned = root / "canned.json"
    canned.write_text(json.dumps({q["prompt"]: q["answer"] for q in planted.QUALITY}))
    (cluster / "backends" / "refplant.yaml").write_text(planted.backend_yaml(canned))  # where the workers look
    (root / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in planted.QUALITY))
    path = root / "c.yaml"
    budget = {"trials": 2, "finalists": 1, "repeats": 2, "prune": False, "seed": 2}
    path.write_text(planted.campaign_yaml(tiny_model, root / "q.jsonl", budget))
    out = root / "out"
    tune_campaign_ray(path, out)
    assert ray.is_initialized()  # the cluster it joined is left running
    # Every cell (the untuned start, each trial, the repeats) ran as a task on the cluster's node.
    node = ray.get_runtime_context().get_node_id()
    cells = sorted((out / "cells").glob("*/cell.json"))
    assert len(cells) >= 1 + 2  # two trials may propose the same knobs: one cell
    for info in map(read_json, cells):
        assert info["status"] == "ok" and info["ray"]["node"]["node_id"] == node and info["ray"]["retried"] == 0
    # The study is the driver's, in the tune's folder; the result and the report as a local tune writes them.
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / "study.journal")))
    study = optuna.load_study(study_name="ref", storage=storage)
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.COMPLETE] * 2
    (group,) = read_json(out / "tune.json")["groups"]
    assert len(group["untuned"]["values"]) == 2 and len(group["trials"]) == 2
    assert (out / "tune.md").is_file() and (out / "best" / "ref.yaml").is_file()
