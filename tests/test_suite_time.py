"""benchmarks/suite_time.py: the table `make test` ends with, and the total its budget is judged on."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType

import pytest

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


def test_engine_starts_are_listed_by_their_cpu_with_the_tests_running_when_they_began(tmp_path: Path) -> None:
    engine = {"kind": "vllm", "command": "python -m vllm.entrypoints.openai.api_server --model small", "cpu_s": 33.0}
    files = {
        "engine": {
            "phase": "engine",
            "wall_s": 100,
            "engines": [
                {**engine, "during": []},
                {**engine, "cpu_s": 61.5, "during": ["tests/test_e2e_x.py::test_int4"]},
            ],
            "engine_cpu_by_test": {"tests/test_e2e_x.py::test_int4": 40.0, "tests/test_e2e_x.py::test_bench": 12.5},
        }
    }
    (tmp_path / "engine.json").write_text(json.dumps(files["engine"]))
    script = _script()
    text = script.table(script.load(tmp_path), slowest=5, budget=540)
    listed = text[text.index("Engine starts") :]
    assert listed.index("61.5 s  vllm  [engine]  test_int4") < listed.index("33.0 s  vllm  [engine]  at collection")
    served = text[text.index("Engine CPU") :]
    assert served.index("40.0 s  tests/test_e2e_x.py::test_int4") < served.index(
        "12.5 s  tests/test_e2e_x.py::test_bench"
    )


def test_the_sampler_records_an_engine_start_its_cpu_and_the_test_running(tmp_path: Path) -> None:
    import subprocess
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from suite_timing import EngineStarts, _kind

    # Its own signature: a real one would make the unit phase's sampler count this stand-in.
    starts = EngineStarts({"fake-engine": ("bakeoff-fake-engine",)})
    starts.running.add("tests/test_x.py::test_starts_one")
    # A process whose command line carries an engine's signature, burning a little CPU first.
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    script = tmp_path / "engine.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script), "bakeoff-fake-engine"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            starts.sample()
            listed = starts.listed()
            if listed and listed[0]["cpu_s"] >= 0.3:
                break
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert starts.counts() == {"fake-engine": 1}
    (start,) = starts.listed()
    assert start["during"] == ["tests/test_x.py::test_starts_one"] and "bakeoff-fake-engine" in start["command"]
    assert start["cpu_s"] >= 0.3
    # Its CPU is charged to the test that was running while it was spent.
    assert starts.by_test == {"tests/test_x.py::test_starts_one": pytest.approx(start["cpu_s"], abs=0.05)}
    # A runtime's client is not the engine (its container's processes are), and a script that
    # only names the engine is a pre-flight parse.
    assert _kind(["/usr/bin/podman", "run", "-d", "img", "python", "-m", "vllm.entrypoints.openai.api_server"]) is None
    assert _kind(["python", "-c", "import vllm  # vllm serve parser", "{}"]) == "vllm parse"
    assert _kind(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]) == "vllm"
