"""Warm repeats: one start per server across interleaved rounds, against the reference server.

Two reference servers (process launcher, vLLM's wire profile) measured in three rounds with
``warm_repeats: true``: each is started once and kept up, the rounds stay interleaved, each round
sends its own requests (the same to both servers), the cold start is counted once, and every server
is stopped when the campaign is done with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bakeoff.campaign.cells import plans_dir, prepare
from bakeoff.campaign.execute import _run_cells
from bakeoff.campaign.progress import CampaignProgress, cell_estimate
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.report.decision import first_screen, repeat_design
from bakeoff.results.store import CELL_INFO, read_json
from bakeoff.serving.process import port_in_use
from bakeoff.workloads.plan_store import load_plans

BACKEND = """\
name: ref-{label}
display_name: reference server (test)
runtime: process
accelerator: cpu
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}",
          "--profile", "vllm", "--ttft-ms", "5", "--itl-ms", "{itl}"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
cache_reset: {kind: none}
"""

WARM = {
    "name": "warm",
    "servers": [{"backend": "ref-fast", "label": "fast"}, {"backend": "ref-slow", "label": "slow"}],
    "workloads": [
        {
            "kind": "concurrency",
            "name": "w",
            "levels": [2],
            "requests_per_level": 6,
            "min_duration_s": 0,
            "warmup_requests": 1,
            "input_len": 16,
            "output_len": 8,
        }
    ],
    "repeats": 3,
    "warm_repeats": True,
    "measure_warm_restart": False,
}


def test_warm_repeats_refuse_workloads_a_warm_server_cannot_measure_honestly() -> None:
    base = {**WARM, "model": {"preset": "tiny"}}
    chat = {"kind": "multi_turn", "name": "chat", "conversations": 2, "turns": 2, "user_len": 8, "output_len": 4}
    with pytest.raises(ValueError, match=r"workloads\[1\] \(chat\): warm_repeats cannot keep its server warm"):
        CampaignSpec.model_validate({**base, "workloads": [*WARM["workloads"], chat]})  # type: ignore[list-item]
    with pytest.raises(ValueError, match="needs interleave: true"):
        CampaignSpec.model_validate({**base, "interleave": False})
    assert not CampaignSpec.model_validate({**base, "warm_repeats": False}).warm_repeats


def test_each_server_starts_once_and_the_rounds_stay_interleaved(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "backends").mkdir()
    for label, itl in (("fast", "4"), ("slow", "8")):
        text = BACKEND.replace("{label}", label).replace("{itl}", itl)
        (tmp_path / "backends" / f"ref-{label}.yaml").write_text(text)
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "backends"))
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump({**WARM, "model": {"path": str(tiny_model), "served_name": "m"}}))
    out = tmp_path / "out"
    spec, cells = prepare(path, out)
    order = [c.cell_id for c in cells]
    assert order == ["fast__w", "slow__w", "slow__w__r2", "fast__w__r2", "fast__w__r3", "slow__w__r3"]
    # The estimate counts one start per server: round 2 of a server takes less than its round 1.
    estimate = {c.cell_id: cell_estimate(c, False, warm=True).seconds for c in cells}
    assert estimate["slow__w__r2"] < estimate["slow__w"]
    failures: list[str] = []
    _run_cells(cells, out, failures, CampaignProgress([cell_estimate(c, False) for c in cells]), spec)
    assert failures == []

    infos = {cell_id: read_json(out / "cells" / cell_id / CELL_INFO) for cell_id in order}
    assert all(i["status"] == "ok" for i in infos.values())
    # Measured in the interleaved order, each round after the one before.
    started = [infos[c]["started_at"] for c in order]
    assert started == sorted(started)
    for server in ("fast", "slow"):
        mine = [infos[c]["effort"] for c in order if c.startswith(f"{server}__")]
        # One process: the same address every round; its cold start counted on round 1 only.
        assert len({e["server"]["base_url"] for e in mine}) == 1
        assert mine[0]["cold_start_s"] > 0 and [e["cold_start_s"] for e in mine[1:]] == [None, None]
        assert [e.get("warm_start_of") for e in mine] == [None, f"{server}__w", f"{server}__w"]
        # Stopped once the campaign was done with it.
        port = int(mine[0]["server"]["base_url"].rsplit(":", 1)[1])
        assert not port_in_use(port)
        # Only round 1's cell holds a server log: nothing else was started.
        assert [(out / "cells" / c / "server.log").is_file() for c in order if c.startswith(f"{server}__")] == [
            True,
            False,
            False,
        ]
    # Each round its own requests (a warm server has seen round 1's), the same for every server in it.
    prompts = [[r.prompt for r in load_plans(plans_dir(out, "w", n, warm=True))[0].requests] for n in (1, 2, 3)]
    assert prompts[0] != prompts[1] != prompts[2] and prompts[0] != prompts[2]
    hashes = {c: infos[c]["fingerprint"]["plan_hash"] for c in order}
    assert hashes["fast__w__r2"] == hashes["slow__w__r2"] != hashes["fast__w"] == hashes["slow__w"]
    # The report says how repeats spent their starts, on its first screen.
    assert repeat_design(out) == "Repeats on one warm start; cold start measured once per server."
    assert "Repeats on one warm start; cold start measured once" in first_screen(out)
    assert spec.warm_repeats
