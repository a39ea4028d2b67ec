"""How pytest-xdist shares the suite out among its workers (a plugin registered by conftest.py).

Two rules on top of ``--dist loadscope`` (a module, or a class, runs on one worker):

- **Shared scopes.** Tests in different modules that must run on one worker form one scope
  (a module, or one test named by its id): the tests that borrow the session's started
  small-model engines (``small_engines``: a second worker would start a second set), and the
  modules that start podman containers (the container campaign asserts that no bakeoff
  container is left, which a container test on another worker would break for a moment).
  `make test` runs the real-engine phase on two workers: these two scopes take one each, and
  the rest fill in.
- **Longest first.** xdist hands scopes out largest test count first, which put the
  four-test rehearsal classes and the one-test campaign modules (test_rehearsal,
  test_verdict_campaign) last: they ended the unit phase with one worker busy for a minute
  (``last_finished`` in ``.suite-times/unit.json``). `make test` passes
  ``--no-loadscope-reorder``, so scopes go out in collection order, and the modules measured
  to take longest (benchmarks/suite_time.py) are collected first.
"""

from __future__ import annotations

from typing import Any

import pytest

SHARED_SCOPES = {
    "small-engines": (
        "tests/test_e2e_prefix.py",
        "tests/test_e2e_workloads.py",
        "tests/test_e2e_vllm.py",
        # One test, not the module: the module's llama.cpp soak starts its own engine, and on the other
        # worker it shortens the small-engine worker, the phase's longer half, by its 23 s.
        "tests/test_e2e_soak.py::test_a_soak_on_vllm_cpu_has_windows_memory_and_its_kv_pool",
    ),
    "podman": ("tests/test_containers.py", "tests/test_e2e_container.py", "tests/test_preflight.py"),
}
_SCOPE_OF = {unit: scope for scope, units in SHARED_SCOPES.items() for unit in units}

# Slowest first, from the phases' timings on a 2-core host (worker seconds per module).
LONGEST_FIRST = (
    "tests/test_e2e_prefix.py",
    "tests/test_e2e_workloads.py",
    "tests/test_e2e_vllm.py",
    "tests/test_e2e_soak.py",
    "tests/test_e2e_container.py",
    "tests/test_containers.py",
    "tests/test_preflight.py",
    "tests/test_e2e_vllm_int4.py",
    "tests/test_rehearsal.py",
    "tests/test_tune.py",
    "tests/test_packaging.py",
    "tests/test_resume.py",
    "tests/test_ray.py",
    "tests/test_verdict_campaign.py",
    "tests/test_history.py",
    "tests/test_rehearsal_quality.py",
    "tests/test_report_browser.py",
    "tests/test_serve.py",
    "tests/test_measurement.py",
)
_RANK = {module: rank for rank, module in enumerate(LONGEST_FIRST)}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def shared_scope(nodeid: str) -> str | None:
    """The shared scope a test belongs to: named by itself (its id up to any parameters), else by its module."""
    return _SCOPE_OF.get(nodeid.split("[", 1)[0]) or _SCOPE_OF.get(module_of(nodeid))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: the order inside a module, which its fixtures may rely on, is kept.
    items.sort(key=lambda item: _RANK.get(module_of(item.nodeid), len(_RANK)))
    strays = {
        module_of(item.nodeid)
        for item in items
        if "small_engines" in getattr(item, "fixturenames", ()) and shared_scope(item.nodeid) != "small-engines"
    }
    if strays:
        raise pytest.UsageError(
            f"{sorted(strays)} borrow small_engines: add them to SHARED_SCOPES['small-engines'] in "
            "tests/scheduling.py, or a second worker starts a second set of engines"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class SharedScopes(LoadScopeScheduling):
        """``loadscope``, with the modules of a shared scope as one work unit."""

        def _split_scope(self, nodeid: str) -> str:
            # The one method xdist's own loadfile mode overrides to choose its units.
            return shared_scope(nodeid) or super()._split_scope(nodeid)

    return SharedScopes(config, log) if config.getoption("dist") == "loadscope" else None
