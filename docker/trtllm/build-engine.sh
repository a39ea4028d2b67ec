#!/usr/bin/env bash
# Build (or reuse) a TensorRT-LLM engine for one Hugging Face model: convert_checkpoint.py
# then trtllm-build, in the pinned release image that still ships both (1.3.0rc14, as in
# backends/trtllm-engine.yaml: release images after rc20 ship no trtllm-build). Prints the engine
# folder, which is then served as the model (docker/trtllm/compose.yaml, profile engine).
#
# The cache key and layout are those of bakeoff.serving.engine_build (backends/trtllm-engine.yaml),
# so bakeoff reuses engines built here and the other way round:
#   <cache>/<key>/engine/     the engine (+ tokenizer/)
#   <cache>/<key>/build.json  written last, only when every step succeeded
# The key hashes the builder image, the model folder's files (weights by their first and
# last MiB) and the knobs baked into the engine.
#
# usage: build-engine.sh [--print-key] MODEL_DIR [CACHE_DIR]
#   CACHE_DIR defaults to $BAKEOFF_CACHE_DIR/engines, else ~/.cache/bakeoff/engines.
# Baked knobs (environment; unset = TensorRT-LLM's default):
#   MAX_BATCH_SIZE (max_num_seqs)       MAX_NUM_TOKENS (max_num_batched_tokens)
#   MAX_SEQ_LEN (max_model_len)         TP_SIZE (tensor_parallel_size)
#   QUANTIZATION: none | int8_wo | int4_wo (weight-only, no calibration data needed)
# RUNTIME: podman or docker (default: podman when installed); IMAGE overrides the image.
# GPUS: the GPU indices the build runs on (default 0; comma-separated), never all of them.
set -euo pipefail

IMAGE="${IMAGE:-${NGC_REGISTRY:?set NGC_REGISTRY to the host of the NVIDIA container registry}/nvidia/tensorrt-llm/release:1.3.0rc14}"
SAMPLE=1048576          # weights are fingerprinted by their first and last MiB
SMALL=$((16 << 20))     # other files up to this size are hashed whole

print_key=0
if [ "${1:-}" = "--print-key" ]; then
  print_key=1
  shift
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,20p' "$0" >&2
  exit 2
fi
MODEL_DIR="$(cd "$1" && pwd)"
if [ -n "${2:-}" ]; then
  CACHE="$2"
elif [ -n "${BAKEOFF_CACHE_DIR:-}" ]; then
  CACHE="$BAKEOFF_CACHE_DIR/engines"
else
  CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/bakeoff/engines"
fi
[ -f "$MODEL_DIR/config.json" ] || { echo "$MODEL_DIR has no config.json" >&2; exit 2; }

for var in MAX_BATCH_SIZE MAX_NUM_TOKENS MAX_SEQ_LEN TP_SIZE; do
  value="${!var:-}"
  if [ -n "$value" ] && ! [[ "$value" =~ ^[1-9][0-9]*$ ]]; then
    echo "$var must be a positive integer, got '$value'" >&2
    exit 2
  fi
done
QUANTIZATION="${QUANTIZATION:-none}"
case "$QUANTIZATION" in
  none|int8_wo|int4_wo) ;;
  *) echo "QUANTIZATION must be none, int8_wo or int4_wo, got '$QUANTIZATION'" >&2; exit 2 ;;
esac

sha() { sha256sum | cut -d' ' -f1; }

# The text the key hashes; keep in step with bakeoff.serving.engine_build.engine_key_manifest.
manifest() {
  printf '%s\n' "bakeoff-engine-key v2" "image $IMAGE"
  local name f size size_class
  while IFS= read -r name; do
    f="$MODEL_DIR/$name"
    size=$(stat -L -c %s "$f")
    case "$name" in
      *.safetensors|*.bin|*.pt|*.pth|*.gguf) size_class=weight ;;
      *) if [ "$size" -le "$SMALL" ]; then size_class=small; else size_class=weight; fi ;;
    esac
    if [ "$size_class" = small ]; then
      printf 'file %s %s\n' "$name" "$(sha < "$f")"
    else
      printf 'sample %s %s %s %s\n' "$name" "$size" \
        "$(head -c "$SAMPLE" "$f" | sha)" "$(tail -c "$SAMPLE" "$f" | sha)"
    fi
  done < <(find -L "$MODEL_DIR" -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort)
  # Knob names in sorted order, unset ones at the backend's default (backends/trtllm-engine.yaml).
  printf 'knob %s\n' \
    "max_model_len=${MAX_SEQ_LEN:-default}" \
    "max_num_batched_tokens=${MAX_NUM_TOKENS:-8192}" \
    "max_num_seqs=${MAX_BATCH_SIZE:-2048}" \
    "quantization=$QUANTIZATION" \
    "tensor_parallel_size=${TP_SIZE:-1}"
}

KEY="$(manifest | sha | cut -c1-16)"
if [ "$print_key" = 1 ]; then
  echo "$KEY"
  exit 0
fi
WORK="$CACHE/$KEY"
if [ -f "$WORK/build.json" ] && [ -f "$WORK/engine/config.json" ]; then
  echo "cached engine $KEY" >&2
  echo "$WORK/engine"
  exit 0
fi
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

if [ -z "${RUNTIME:-}" ]; then
  if command -v podman >/dev/null; then RUNTIME=podman; else RUNTIME=docker; fi
fi
RT=("$RUNTIME")
GPUS="${GPUS:-0}"
GPU=()
for g in ${GPUS//,/ }; do GPU+=(--device "nvidia.com/gpu=$g"); done
case "$(basename "$RUNTIME")" in
  # docker's --gpus value is CSV: a list of devices is quoted inside it.
  *docker*) if [[ "$GPUS" == *,* ]]; then GPU=(--gpus "\"device=$GPUS\""); else GPU=(--gpus "device=$GPUS"); fi ;;
  # crun fails on cgroups on some hosts; runc works (as bakeoff.serving.containers does).
  podman) if command -v runc >/dev/null; then RT=(podman --runtime runc); fi ;;
esac

step() {
  "${RT[@]}" run --rm -v "$MODEL_DIR:/model:ro" -v "$WORK:/work" \
    --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 "${GPU[@]}" \
    --entrypoint "$1" "$IMAGE" "${@:2}"
}

convert=(python3 /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py
  --model_dir /model --output_dir /work/checkpoint --dtype float16)
[ -n "${TP_SIZE:-}" ] && convert+=(--tp_size "$TP_SIZE")
case "$QUANTIZATION" in
  int8_wo) convert+=(--use_weight_only --weight_only_precision int8) ;;
  int4_wo) convert+=(--use_weight_only --weight_only_precision int4) ;;
esac
build=(trtllm-build --checkpoint_dir /work/checkpoint --output_dir /work/engine
  --gemm_plugin auto --use_paged_context_fmha enable)
[ -n "${MAX_BATCH_SIZE:-}" ] && build+=(--max_batch_size "$MAX_BATCH_SIZE")
[ -n "${MAX_NUM_TOKENS:-}" ] && build+=(--max_num_tokens "$MAX_NUM_TOKENS")
[ -n "${MAX_SEQ_LEN:-}" ] && build+=(--max_seq_len "$MAX_SEQ_LEN")
tokenizer='mkdir -p /work/engine/tokenizer && for f in /model/*.json /model/*.txt /model/*.model /model/*.jinja; do if [ -f "$f" ]; then cp "$f" /work/engine/tokenizer/; fi; done'

started=$(date +%s.%N)
{
  # Leftovers of an interrupted build may belong to the container's root: remove them there.
  if [ -e "$WORK/engine" ] || [ -e "$WORK/checkpoint" ]; then
    step rm -rf /work/engine /work/checkpoint
  fi
  step "${convert[@]}"
  step "${build[@]}"
  step sh -c "$tokenizer"
  step rm -rf /work/checkpoint
} >>"$WORK/build.log" 2>&1 || {
  echo "engine build failed; log: $WORK/build.log" >&2
  tail -n 25 "$WORK/build.log" >&2
  exit 1
}
[ -f "$WORK/engine/config.json" ] || { echo "no engine in $WORK/engine" >&2; exit 1; }
seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
printf '{"key": "%s", "seconds": %s, "image": "%s", "built_by": "build-engine.sh"}\n' \
  "$KEY" "$seconds" "$IMAGE" >"$WORK/build.json"
echo "engine $KEY built in ${seconds}s" >&2
echo "$WORK/engine"
