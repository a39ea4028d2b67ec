#!/usr/bin/env bash
# Owns: building bakeoff's local container images, cached, with their build time recorded.
#
#   scripts/build-images.sh NAME...        NAME: debian-base, or a docker/NAME/ folder
#                                          holding a Containerfile and image.env (vllm-cpu)
#
# An image whose tag already exists is skipped (set BAKEOFF_REBUILD=1 to rebuild). Each
# build's wall time goes to $BAKEOFF_CACHE_DIR/images.json (default ~/.cache/bakeoff), which
# bakeoff.serving.images reads so reports can show the engineering effort an image cost.
#
# Builds reuse the host pip's settings (`pip config list`): the wheels of its find-links
# folders, its index URLs as build args (local file:// indexes are mounted read-only at
# the same path), and its CA bundle as a build secret, since TLS to the package registry
# may be re-signed by a private or corporate-proxy CA.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE_TAG=localhost/bakeoff/debian-base:bookworm
CACHE_DIR=${BAKEOFF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bakeoff}
CACHE_FILE=$CACHE_DIR/images.json

die() { echo "build-images: $*" >&2; exit 1; }
trap 'echo "build-images: failed at line $LINENO (exit $?)" >&2' ERR

# Build contexts live outside the repo; removed on every exit, failed builds included.
TMP_DIRS=()
trap 'rm -rf "${TMP_DIRS[@]}"' EXIT

now() { date +%s.%N; }

record_build() { # TAG START END
    mkdir -p "$CACHE_DIR"
    python3 - "$CACHE_FILE" "$1" "$2" "$3" <<'PY'
import datetime
import json
import sys
from pathlib import Path

path, tag, start, end = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
try:
    data = json.loads(path.read_text())
except (OSError, ValueError):
    data = {}
data[tag] = {
    "build_s": round(end - start, 1),
    "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
}
tmp = path.with_suffix(".tmp")
tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
tmp.replace(path)
print(f"build-images: {tag} built in {end - start:.1f} s (recorded in {path})")
PY
}

is_cached() { # TAG
    if [[ ${BAKEOFF_REBUILD:-0} == 1 ]]; then return 1; fi
    if podman image exists "$1"; then
        echo "build-images: $1 present, skipped (BAKEOFF_REBUILD=1 rebuilds)"
        return 0
    fi
    return 1
}

pip_setting() { # KEY -> value of the host pip's setting, environment first, else empty
    local pip_cmd=(pip)
    command -v pip >/dev/null 2>&1 || pip_cmd=(python3 -m pip)
    "${pip_cmd[@]}" config list 2>/dev/null | python3 -c '
import sys
key = sys.argv[1]
found = {}
for line in sys.stdin:
    name, sep, value = line.strip().partition("=")
    scope, _, k = name.rpartition(".")
    if sep and k == key:
        found[scope] = value.strip().strip("\x27\"")
for scope in (":env:", "site", "user", "global"):
    if scope in found:
        print(found[scope])
        break
' "$1" || true
}

build_base() {
    is_cached "$BASE_TAG" && return 0
    local start
    start=$(now)
    bash "$ROOT/docker/base/build-rootfs.sh" "$BASE_TAG"
    record_build "$BASE_TAG" "$start" "$(now)"
}

build_containerfile() { # NAME
    local name=$1 dir=$ROOT/docker/$1
    [[ -f $dir/Containerfile && -f $dir/image.env ]] \
        || die "unknown image $name: docker/$name/ needs a Containerfile and an image.env"
    local TAG="" VLLM_VERSION="" WHEELS=""
    # shellcheck disable=SC1091
    source "$dir/image.env"
    [[ -n $TAG ]] || die "docker/$name/image.env sets no TAG"
    is_cached "$TAG" && return 0
    build_base

    local ctx
    ctx=$(mktemp -d /var/tmp/bakeoff-build.XXXXXX)
    TMP_DIRS+=("$ctx")
    cp -a "$dir/." "$ctx/"
    mkdir -p "$ctx/wheels"

    local find_links wheel_dir pattern copied=0
    find_links=$(pip_setting find-links)
    for wheel_dir in $find_links; do
        wheel_dir=${wheel_dir#file://}
        [[ -d $wheel_dir ]] || continue
        for pattern in $WHEELS; do
            for wheel in "$wheel_dir"/$pattern; do
                [[ -f $wheel ]] || continue
                # A hard link costs nothing when the context shares the wheel's filesystem.
                ln "$wheel" "$ctx/wheels/" 2>/dev/null || cp "$wheel" "$ctx/wheels/"
                copied=$((copied + 1))
            done
        done
    done
    if [[ -n $WHEELS && $copied -eq 0 ]]; then
        die "no wheel matching '$WHEELS' in the host pip's find-links (${find_links:-none});" \
            "put the CPU torch wheel there (see 'pip config list')"
    fi

    local cert
    cert=$(pip_setting cert)
    cert=${cert:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
    [[ -f $cert ]] || { cert=$ctx/empty-ca.crt; : >"$cert"; }

    local index_url extra_urls url extra_kept=() volumes=()
    index_url=$(pip_setting index-url)
    extra_urls=$(pip_setting extra-index-url)
    for url in $index_url $extra_urls; do
        local dir=${url#file://}
        [[ $url == file://* && -d $dir ]] || continue
        # A local "simple" index links its files as ../../files/NAME, beside simple/.
        [[ $(basename "$dir") == simple ]] && dir=$(dirname "$dir")
        volumes+=(--volume "$dir:$dir:ro")
    done
    for url in $extra_urls; do extra_kept+=("$url"); done

    local start
    start=$(now)
    echo "build-images: building $TAG from docker/$name/Containerfile"
    podman build --network host \
        -f "$ctx/Containerfile" -t "$TAG" \
        --build-arg "BASE=$BASE_TAG" \
        ${VLLM_VERSION:+--build-arg "VLLM_VERSION=$VLLM_VERSION"} \
        --build-arg "INDEX_URL=$index_url" \
        --build-arg "EXTRA_INDEX_URL=${extra_kept[*]:-}" \
        --secret "id=pip-cert,src=$cert" \
        "${volumes[@]}" \
        "$ctx"
    record_build "$TAG" "$start" "$(now)"
}

(($#)) || die "usage: scripts/build-images.sh NAME...  (debian-base, vllm-cpu)"
command -v podman >/dev/null || die "podman is missing: run scripts/setup-podman.sh"
for name in "$@"; do
    case $name in
        debian-base) build_base ;;
        *) build_containerfile "$name" ;;
    esac
done
