"""``cache_reset: restart``: a cell's server is restarted before a run that needs a cold cache."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import load_backend
from bakeoff.campaign import cell_run as campaign
from bakeoff.campaign import cells as campaign_cells
from bakeoff.campaign.cell_spec import cell_fingerprint, read_cell_spec, write_cell_spec
from bakeoff.campaign.cold_cache import CellServer, needs_cold_cache, prompt_keys
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import LaunchError, SpecError
from bakeoff.measure.slo import resolve_slo
from bakeoff.models.model_source import resolve_model
from bakeoff.notebook import guards as notebook_params
from bakeoff.results.store import CELL_INFO, read_json, read_summary
from bakeoff.serving.handle import ServerHandle
from bakeoff.workloads.kinds import ConcurrencySweep
from bakeoff.workloads.plan_store import save_plans
from bakeoff.workloads.plans import PlannedRequest, RunPlan, SessionPlan
from fake_sglang import FakeState, serve_fake
from plan_workloads import CLOSED, SESSIONS


def closed(name: str, words: str) -> RunPlan:
    reqs = [PlannedRequest(i, "chat", 2, messages=[{"role": "user", "content": f"{words} {i}"}]) for i in range(3)]
    return RunPlan(name, "closed", CLOSED, concurrency=1, requests=reqs)


def sessions() -> RunPlan:
    return RunPlan("sessions", "sessions", SESSIONS, concurrency=1, sessions=[SessionPlan(0, "sys", ["hi"], 1, 2, 0.0)])


class Starts:
    """A stand-in for campaign.start_server that serves the fake and counts starts."""

    def __init__(self, tmp: Path, backend_name: str = "llamacpp", fail_on: int = 0) -> None:
        self.fail_on = fail_on  # this start (1-based) fails as a real failed start would
        self.count = 0
        self.urls: list[str] = []
        self.tmp = tmp
        self.backend = load_backend(backend_name)

    @contextlib.contextmanager
    def __call__(self, *args: object) -> Iterator[tuple[ServerHandle, RenderedLaunch]]:
        self.count += 1
        if self.count == self.fail_on:
            raise LaunchError("server exited during startup")
        with serve_fake(FakeState()) as url:
            self.urls.append(url)
            handle = ServerHandle(url, "m", self.tmp / "server.log", "fake", 0.01, "process")
            yield handle, RenderedLaunch(self.backend, ["fake"], {}, None, {})


def test_a_run_needs_a_cold_cache_when_it_measures_reuse_or_repeats_a_prompt() -> None:
    first, other = closed("c1", "alpha"), closed("c2", "beta")
    sent = prompt_keys(first)
    assert not needs_cold_cache(other, sent)
    assert needs_cold_cache(closed("replay", "alpha"), sent)
    assert needs_cold_cache(sessions(), set())


def test_restart_backend_is_restarted_only_before_runs_that_need_it(tmp_path: Path) -> None:
    starts = Starts(tmp_path)
    restarts: list[dict[str, Any]] = []
    with CellServer(starts, starts.backend, restarts) as server:
        first = server.prepare(closed("c1", "alpha"))
        assert first is not None and first.ok is True and "fresh" in first.detail
        server.ran(closed("c1", "alpha"))
        fresh_prompts = server.prepare(closed("c2", "beta"))
        assert fresh_prompts is not None and fresh_prompts.ok is None and starts.count == 1
        server.ran(closed("c2", "beta"))
        replay = server.prepare(closed("replay", "alpha"))
        assert replay is not None and replay.ok is True and "restarted" in replay.detail
        assert starts.count == 2 and server.current()[0].base_url == starts.urls[1]
    assert [r["before_run"] for r in restarts] == ["replay"] and restarts[0]["start_s"] >= 0


def test_http_reset_backends_are_left_to_the_runner(tmp_path: Path) -> None:
    starts = Starts(tmp_path, "sglang")
    with CellServer(starts, starts.backend, []) as server:
        server.ran(sessions())
        assert server.prepare(sessions()) is None and starts.count == 1


def test_run_plans_restarts_between_runs_and_records_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = Starts(tmp_path)
    wl = ConcurrencySweep(levels=[1], requests_per_level=3, warmup_requests=0, input_len=4, output_len=2)
    cell = campaign_cells.Cell(ServerConfig(backend="llamacpp", label="l"), starts.backend, wl)
    plans = [closed("c1", "alpha"), closed("c2", "beta"), closed("replay", "alpha")]
    restarts: list[dict[str, Any]] = []
    effort: dict[str, Any] = {"server": {"backend": "llamacpp"}}
    summaries: dict[str, Any] = {}
    with CellServer(starts, starts.backend, restarts) as server:
        spec = CampaignSpec(
            name="t", model={"preset": "tiny"}, servers=[cell.server], workloads=[wl], stop_at_saturation=False
        )
        campaign._run_plans(cell, spec, plans, lambda text: 1, server, tmp_path, effort, {}, summaries)
    assert starts.count == 2 and len(restarts) == 1
    assert [summaries[p].cache_reset.ok for p in ("c1", "c2", "replay")] == [True, None, True]
    assert all(summaries[p].requests.ok == 3 for p in summaries)


def write_campaign(folder: Path) -> Path:
    """A prepared campaign folder: one llama.cpp server, plans c1 and a replay of c1; the cell's hand-over."""
    (folder / notebook_params.CAMPAIGN_COPY).write_text(
        "name: t\nmodel: {preset: tiny}\nmeasure_warm_restart: true\nrepeats: 1\n"
        "servers: [{backend: llamacpp, label: l}]\n"
        "workloads: [{kind: concurrency, name: sweep, levels: [1], input_len: 4, output_len: 2}]\n"
    )
    save_plans([closed("c1", "alpha"), closed("replay", "alpha")], folder / "plans" / "sweep")
    spec = load_campaign(folder / notebook_params.CAMPAIGN_COPY)
    [cell] = campaign_cells.expand(spec, resolve_model(spec.model).local_dir)
    return write_cell_spec(folder, spec, cell)


def test_the_cell_hand_over_is_typed_holds_no_key_and_is_all_a_cell_run_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    handed = write_campaign(tmp_path)
    spec = load_campaign(tmp_path / notebook_params.CAMPAIGN_COPY)
    keyed = spec.servers[0].model_copy(update={"api_key_env": "PLANTED_KEY"})
    monkeypatch.setenv("PLANTED_KEY", "sk-planted-secret")
    spec = spec.model_copy(update={"servers": [keyed]})
    [cell] = campaign_cells.expand(spec, resolve_model(spec.model).local_dir)
    assert cell.headers["Authorization"] == "Bearer sk-planted-secret"
    handed = write_cell_spec(tmp_path, spec, cell)
    assert "sk-planted-secret" not in handed.read_text()  # headers are made again, never written
    read = read_cell_spec(handed)
    assert read.cell() == cell and read.campaign == spec and read.slo == resolve_slo(spec.slo)
    assert read.fingerprint == cell_fingerprint(cell, tmp_path)
    assert tmp_path / read.plans == tmp_path / "plans" / "sweep"
    # The measuring side reads the hand-over alone: no campaign copy to reload and expand.
    (tmp_path / notebook_params.CAMPAIGN_COPY).unlink()
    monkeypatch.setattr(campaign, "start_server", Starts(tmp_path))
    assert set(campaign.run_cell(handed)) == {"c1", "replay"}
    assert read_json(tmp_path / "cells" / "l__sweep" / CELL_INFO)["fingerprint"] == read.fingerprint
    with pytest.raises(SpecError, match="bakeoff campaign run"):
        read_cell_spec(tmp_path / "cells" / "nothing" / "cell_spec.json")


def test_run_cell_times_restarts_into_effort_and_retries_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    handed = write_campaign(tmp_path)
    starts = Starts(tmp_path, fail_on=2)  # the restart before "replay" fails once
    monkeypatch.setattr(campaign, "start_server", starts)
    summaries = campaign.run_cell(handed)
    # Start 1 ran c1; its restart failed (a failed start, retried); start 3 is fresh, so
    # "replay" ran there without another restart, and c1 was not run again. Start 4 times
    # the warm restart, since no cache restart did.
    assert starts.count == 4 and set(summaries) == {"c1", "replay"}
    effort = read_json(tmp_path / "cells" / "l__sweep" / CELL_INFO)["effort"]
    assert len(effort["failed_start_attempts"]) == 1 and effort["cache_restarts"] == []
    assert summaries["replay"].cache_reset.detail.startswith("fresh server")
    assert effort["warm_restart_s"] is not None
    run = read_summary(tmp_path / "cells" / "l__sweep" / "runs" / "replay" / "summary.json").effort
    assert run is not None and run.cache_restarts == [] and run.cache_restart_s == 0


def test_run_cell_reuses_a_cache_restart_as_the_warm_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    handed = write_campaign(tmp_path)
    starts = Starts(tmp_path)
    monkeypatch.setattr(campaign, "start_server", starts)
    summaries = campaign.run_cell(handed)
    assert starts.count == 2 and summaries["replay"].cache_reset.ok is True
    effort = read_summary(tmp_path / "cells" / "l__sweep" / "runs" / "replay" / "summary.json").effort
    assert effort is not None and [r.before_run for r in effort.cache_restarts] == ["replay"]
    assert effort.warm_restart_s == effort.cache_restarts[0].start_s
    assert effort.cache_restart_s is not None and effort.cache_restart_s >= effort.warm_restart_s
