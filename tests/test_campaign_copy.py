"""campaign.yaml read back below the spec loader: the typed view report, analysis and history use."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.analysis.verdict import campaign_design
from bakeoff.errors import SpecError
from bakeoff.results.layout import CAMPAIGN_COPY, read_campaign_copy

# A user's file as a campaign folder keeps it: shorthand model, a margin in percent, comments.
USERS_FILE = """\
# kept as written
name: copy-test
model: small
servers:
  - backend: vllm-cpu
    knobs: {max_num_seqs: 8}
  - backend: llamacpp
    label: llama
    url: http://10.0.0.1:8000
    api_key_env: KEY
workloads:
  - kind: concurrency
    levels: [1, 4]
min_effect: 10%
repeats: auto
min_repeats: 3
max_repeats: 6
interleave: false
regression: {tpot_ms_p50: 5%}
start_attempts: 3
"""


def _folder(tmp_path: Path, text: str) -> Path:
    (tmp_path / CAMPAIGN_COPY).write_text(text)
    return tmp_path


def test_a_users_file_reads_typed_with_the_rest_kept_as_written(tmp_path: Path) -> None:
    copy = read_campaign_copy(_folder(tmp_path, USERS_FILE))
    assert (copy.name, copy.model, copy.model_label()) == ("copy-test", "small", "small")
    assert [s.name for s in copy.servers] == ["vllm-cpu", "llama"] and copy.servers[1].url == "http://10.0.0.1:8000"
    # A campaign written from this one (bakeoff advise) carries sections and entries over unchanged.
    assert copy.servers[1].written() == {
        "backend": "llamacpp", "label": "llama", "url": "http://10.0.0.1:8000", "api_key_env": "KEY"
    }  # fmt: skip
    assert copy.sections(("start_attempts", "min_effect", "slo")) == {"start_attempts": 3, "min_effect": "10%"}
    assert copy.workload_name(copy.workloads[0]) == "concurrency" and copy.regression == {"tpot_ms_p50": "5%"}
    design = campaign_design(tmp_path)
    assert design.min_effect == pytest.approx(0.10) and design.paired is False and design.alpha < 0.05


def test_an_empty_copy_reads_as_the_defaults_and_a_bad_field_names_the_file(tmp_path: Path) -> None:
    copy = read_campaign_copy(_folder(tmp_path, ""))
    assert (copy.name, copy.servers, copy.gpu, copy.interleave, copy.repeats) == (None, [], False, True, 3)
    with pytest.raises(SpecError, match=CAMPAIGN_COPY):
        read_campaign_copy(_folder(tmp_path, "name: x\nservers: [{label: no-backend}]\n"))
