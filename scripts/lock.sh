#!/usr/bin/env bash
# Regenerate constraints.txt: resolve pyproject.toml's ranges (every extra `make` or CI
# installs, plus the dev group) in a throwaway venv and freeze the result as exact pins.
#
#   scripts/lock.sh            keeps today's versions where the ranges still allow them
#   scripts/lock.sh --upgrade  takes the newest versions the ranges allow
#
# The ray extra is resolved with the rest: tests/test_ray.py runs campaigns on a local Ray cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS="report,lab,modelgen,telemetry-gpu,history,ray"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# torch stays at the CPU build that lies in pip's local wheel folder: any newer release
# resolves to a CUDA build of several GB (and its nvidia-* libraries).
echo "torch==${TORCH_VERSION:-2.13.0}" >"$tmp/seed.txt"
if [ "${1:-}" != "--upgrade" ] && [ -f constraints.txt ]; then
  grep -v '^torch==' constraints.txt >>"$tmp/seed.txt"
fi
seed=(-c "$tmp/seed.txt")
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet "${seed[@]}" 'pip>=25.1'
"$tmp/venv/bin/python" -m pip install --quiet "${seed[@]}" -e ".[$EXTRAS]" --group dev
{
  echo "# Exact versions for the harness's environment (.venv): what \`make\`, CI and scripts/bootstrap.sh"
  echo "# install, with \`pip install -c constraints.txt\`. pyproject.toml holds the ranges a plain"
  echo "# \`pip install bakeoff\` resolves. Regenerate with scripts/lock.sh (extras: $EXTRAS, group dev)."
  # torch's +cpu local label is dropped: `torch==2.13.0` matches the CPU wheel and any build.
  "$tmp/venv/bin/python" -m pip freeze --all --exclude-editable | grep -v '^setuptools==\|^wheel==' \
    | sed 's/^torch==\([^+]*\)+.*$/torch==\1/'
} >constraints.txt
echo "lock: wrote constraints.txt ($(grep -vc '^#' constraints.txt) pins)"
