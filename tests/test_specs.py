"""Campaign and workload validation: bad input is refused, naming the field, before any run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bakeoff.backends.spec import MetricsSpec, RequestQuirks, load_backend
from bakeoff.campaign.cells import check_metric_support, expand, validate_campaign
from bakeoff.campaign.specs import load_campaign
from bakeoff.errors import SpecError
from bakeoff.models.model_source import resolve_model
from bakeoff.workloads.kinds import MultiTurn

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "t",
    "model": {"preset": "tiny"},
    "servers": [{"backend": "vllm-cpu", "label": "a"}],
    "workloads": [{"kind": "concurrency", "levels": [1, 2], "input_len": 32, "output_len": 8}],
}


def write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def with_(**changes: object) -> dict[str, object]:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data.update(changes)
    return data


def test_valid_campaign_expands_to_cells(tmp_path: Path, tiny_model: Path) -> None:
    cells = validate_campaign(write(tmp_path, BASE))
    # Three repeats by default, each its own cell folder.
    assert [c.cell_id for c in cells] == ["a__concurrency", "a__concurrency__r2", "a__concurrency__r3"]


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"kind": "concurrency", "levels": [0], "input_len": 8, "output_len": 8}, "levels.0"),
        ({"kind": "concurrency", "levels": [], "input_len": 8, "output_len": 8}, "levels"),
        ({"kind": "concurrency", "levels": [1], "input_len": -5, "output_len": 8}, "input_len"),
        ({"kind": "concurrency", "levels": [1], "input_len": 8, "output_len": 8, "colour": 1}, "colour"),
        ({"kind": "open_loop", "rates": [0], "input_len": 8, "output_len": 8}, "rates.0"),
        ({"kind": "open_loop", "rates": [], "input_len": 8, "output_len": 8}, "rates"),
        ({"kind": "multi_turn", "turns": 0}, "turns"),
        ({"kind": "nonsense"}, "workloads.0"),
    ],
)
def test_bad_workload_names_the_field(tmp_path: Path, workload: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        load_campaign(write(tmp_path, with_(workloads=[workload])))
    assert field in str(err.value)


def test_unknown_top_level_key(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"servrs: unknown key"):
        load_campaign(write(tmp_path, with_(servrs=[])))


def test_missing_model_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"model.path: .*no config.json"):
        validate_campaign(write(tmp_path, with_(model={"path": str(tmp_path / "nowhere")})))


def test_unknown_backend_lists_known_ones(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown backend 'vlm'.*vllm-cpu"):
        validate_campaign(write(tmp_path, with_(servers=[{"backend": "vlm"}])))


def test_bad_knob_refused_before_start(tmp_path: Path) -> None:
    data = with_(servers=[{"backend": "vllm-cpu", "knobs": {"max_num_seqs": 0}}])
    with pytest.raises(SpecError, match=r"vllm-cpu.*max_num_seqs.*minimum"):
        validate_campaign(write(tmp_path, data))


def test_prompt_plus_output_beyond_context(tmp_path: Path, tiny_model: Path) -> None:
    data = with_(
        servers=[{"backend": "vllm-cpu", "label": "a", "knobs": {"max_model_len": 512}}],
        workloads=[{"kind": "concurrency", "levels": [1], "input_len": 500, "output_len": 64}],
    )
    with pytest.raises(SpecError, match=r"workloads\[0\].*564 tokens.*accepts 512"):
        validate_campaign(write(tmp_path, data))


def test_metric_backend_cannot_expose() -> None:
    backend = load_backend("vllm-cpu").model_copy(
        update={"metrics": MetricsSpec(names={}), "request": RequestQuirks(reports_cached_tokens=False)}
    )
    workload = MultiTurn(conversations=2, turns=2, system_prompt_len=64)
    with pytest.raises(SpecError, match=r"workloads\[0\].verify_reuse: backend 'vllm-cpu'"):
        check_metric_support("workloads[0]", workload, backend)
    check_metric_support("workloads[0]", MultiTurn(verify_reuse=False), backend)


def test_gpu_backend_needs_gpu_flag(tmp_path: Path) -> None:
    data = with_(servers=[{"backend": "vllm", "label": "g"}])
    with pytest.raises(SpecError, match=r"servers\[0\].backend: vllm needs a GPU"):
        validate_campaign(write(tmp_path, data))


@pytest.mark.parametrize("path", sorted((REPO / "campaigns").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_campaigns_validate(path: Path) -> None:
    assert validate_campaign(path)


# --- real models, real users ---------------------------------------------------------------


def test_model_can_be_a_hugging_face_id_resolved_in_the_hub_cache_without_downloading(tmp_path: Path) -> None:
    spec = load_campaign(write(tmp_path, with_(model={"hf_id": "meta-llama/Llama-3.1-8B-Instruct"})))
    source = resolve_model(spec.model, environ={"HF_HOME": str(tmp_path / "hf")})
    assert source.hf_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert source.local_dir is None and source.hub_cache == tmp_path / "hf" / "hub"  # not cached, not fetched
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"hf_id": "org/name/extra"}, "model.hf_id: .*not a Hugging Face model id"),
        ({"hf_id": "org/a..b"}, "model.hf_id: .*not a Hugging Face model id"),
        ({"hf_id": "org/name", "preset": "tiny"}, "exactly one of 'preset'.*'hf_id'"),
        ({}, "exactly one of 'preset'.*'hf_id'"),
    ],
)
def test_bad_model_source_names_the_field(tmp_path: Path, model: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_campaign(write(tmp_path, with_(model=model)))


def test_server_with_a_key_variable_headers_and_a_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = {
        "backend": "vllm-cpu",
        "url": "https://gateway.internal:8443/team-a",
        "api_key_env": "TEAM_A_KEY",
        "headers": {"X-Route": "canary"},
    }
    monkeypatch.setenv("TEAM_A_KEY", "k-123")
    spec = load_campaign(write(tmp_path, with_(servers=[server])))
    # What every request of its cells carries: the key from the variable, and the extra headers.
    headers = {cell.server.label: cell.headers for cell in expand(spec, None)}
    assert list(headers.values()) == [{"Authorization": "Bearer k-123", "X-Route": "canary"}]


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"url": "gateway:8000"}, r"servers.0.url: .*http\(s\)://host"),
        ({"api_key_env": "sk-live-0a1b"}, "servers.0.api_key_env: .*never the key itself"),
        ({"headers": {"Content-Length": "1"}}, "servers.0.headers: .*set by bakeoff itself"),
        ({"headers": {"X-A": "1\r\nX-B: 2"}}, "servers.0.headers: .*line break"),
        ({"api_key_env": "K", "headers": {"Authorization": "Bearer x"}}, "servers.0: .*keep one of them"),
    ],
)
def test_bad_server_auth_settings_name_the_field(tmp_path: Path, server: dict[str, object], message: str) -> None:
    data = with_(servers=[{"backend": "vllm-cpu", **server}])
    with pytest.raises(SpecError, match=message) as err:
        load_campaign(write(tmp_path, data))
    assert "sk-live-0a1b" not in str(err.value)  # a key pasted in by mistake is not echoed


def test_min_tokens_in_extra_body_is_refused() -> None:
    with pytest.raises(ValueError, match=r"use request\.min_tokens"):
        RequestQuirks(extra_body={"min_tokens": 8})
