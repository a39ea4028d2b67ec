#!/usr/bin/env bash
# Owns: the Debian bookworm base image every locally built bakeoff image starts FROM.
#
# No registry pulls are possible on the machines bakeoff runs on, so the base comes from
# debootstrap (a minbase root filesystem from Debian's package archive) and is turned
# into an image with `podman import`.
#
#   docker/base/build-rootfs.sh [TAG]      (default localhost/bakeoff/debian-base:bookworm)
#
# The Debian mirror is the one the host's apt already uses (or BAKEOFF_DEBIAN_MIRROR),
# so no host name lives in this repository. Runs as root (debootstrap needs it).
set -euo pipefail

TAG=${1:-localhost/bakeoff/debian-base:bookworm}
SUITE=bookworm
# g++, python3-dev: torch.compile builds C++ against Python.h when vLLM starts.
# libnuma1, libgomp1: vLLM's CPU kernels and torch's OpenMP runtime.
INCLUDE=python3,python3-venv,python3-pip,python3-dev,g++,libnuma1,libgomp1,ca-certificates

host_mirror() {
    # First main-archive URI of the host's apt sources (deb822 first, then one-line
    # format), skipping the security archive, whose layout debootstrap cannot use.
    local uri=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        uri=$(awk 'tolower($1)=="uris:" {for (i=2;i<=NF;i++) print $i}' \
            /etc/apt/sources.list.d/*.sources | grep -v -- '-security' | head -n1 || true)
    fi
    if [[ -z $uri && -f /etc/apt/sources.list ]]; then
        uri=$(awk '$1=="deb" {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
            /etc/apt/sources.list | grep -v -- '-security' | head -n1 || true)
    fi
    echo "$uri"
}

mirror=${BAKEOFF_DEBIAN_MIRROR:-$(host_mirror)}
workdir=$(mktemp -d /var/tmp/bakeoff-rootfs.XXXXXX)
trap 'rm -rf "$workdir"' EXIT

echo "build-rootfs: debootstrap $SUITE (${mirror:-debootstrap default mirror}) -> $TAG"
# An empty mirror argument lets debootstrap use its built-in default.
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$workdir/root" ${mirror:+"$mirror"}

# Package caches and lists are dead weight in an image that never runs apt.
rm -rf "$workdir/root/var/cache/apt/archives/"*.deb "$workdir/root/var/lib/apt/lists/"*

tar --numeric-owner -C "$workdir/root" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE" \
    - "$TAG"
echo "build-rootfs: imported $TAG"
