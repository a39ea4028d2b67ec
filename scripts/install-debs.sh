#!/usr/bin/env bash
# Install the Debian packages `make test`'s set-up needs, in one apt run before the parallel
# set-up starts (dpkg takes one lock, so two set-up steps installing at once would fail):
# the llama.cpp build tools, podman and what builds the base image, and Chromium for the
# report tests. A quick no-op when every package is installed.
#
#   scripts/install-debs.sh
set -euo pipefail

# Installed without their recommends (podman's pull in a desktop's worth); Chromium with its
# own (fonts), as `apt-get install chromium` does.
BARE=(cmake ninja-build g++ podman runc debootstrap)
WITH_RECOMMENDS=(chromium)

missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

install() { # FLAGS... -- PACKAGES...
    local flags=() pkgs
    while [[ $1 != -- ]]; do flags+=("$1"); shift; done
    shift
    mapfile -t pkgs < <(missing "$@")
    ((${#pkgs[@]})) || return 0
    echo "install-debs: installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists on disk first: 'apt-get update' costs tens of seconds and is only
    # needed where they are empty or stale.
    as_root apt-get install -y -qq "${flags[@]}" "${pkgs[@]}" >/dev/null 2>&1 \
        || { as_root apt-get update -qq && as_root apt-get install -y -qq "${flags[@]}" "${pkgs[@]}" >/dev/null; }
}

install --no-install-recommends -- "${BARE[@]}"
install -- "${WITH_RECOMMENDS[@]}"
