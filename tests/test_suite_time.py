"""benchmarks/suite_time.py: the table `make test` ends with, and the total its budget is judged on."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_time", REPO / "benchmarks" / "suite_time.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_phase_run_beside_another_is_shown_but_not_added_to_the_total(tmp_path: Path) -> None:
    slow = [{"test": "tests/test_x.py::test_slow", "seconds": 42.0}]
    files = {
        "lint": {"phase": "lint", "wall_s": 40, "beside": "unit"},
        "unit": {
            "phase": "unit",
            "wall_s": 300,
            "tests": 10,
            "cpu_busy": 0.9,
            "slowest": slow,
            "most_cpu": [{"test": "tests/test_x.py::test_busy", "cpu_s": 30.5}],
        },
        "engine": {"phase": "engine", "wall_s": 250, "tests": 2, "engine_starts": {"vllm": 3}},
    }
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    script = _script()
    text = script.table(script.load(tmp_path), slowest=5, budget=540)
    assert "| lint | 40 (beside unit) |" in text and "| engine | 250 | 2 |  | 3 vllm |" in text
    assert "| **total** | **550** |" in text  # 300 + 250: lint's 40 s were inside the unit phase's
    assert text.endswith("suite after set-up: 550 s, OVER the 540 s budget")
    assert "42.0 s  tests/test_x.py::test_slow  [unit]" in text
    assert "the most CPU" in text and "30.5 s  tests/test_x.py::test_busy  [unit]" in text
    # A unit phase shorter than lint: `make test` waited for lint, so its overshoot counts.
    files["unit"]["wall_s"] = 25
    (tmp_path / "unit.json").write_text(json.dumps(files["unit"]))
    text = script.table(script.load(tmp_path), slowest=5, budget=540)
    assert "| **total** | **290** |" in text  # 25 + (40 - 25) + 250
