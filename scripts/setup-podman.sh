#!/usr/bin/env bash
# Owns: making podman usable for bakeoff on a fresh Debian machine.
#
# Installs the Debian packages podman, runc and debootstrap when missing, and makes
# /etc/containers/containers.conf hold the two settings this machine class needs:
#   [containers] default_ulimits = []   (podman's default nofile/nproc ulimits fail here)
#   [engine]     runtime = "runc"       (crun fails on this kernel's cgroup setup)
# Idempotent and fast when everything is already in place: no apt call, no file write.
set -euo pipefail

CONF=${BAKEOFF_CONTAINERS_CONF:-/etc/containers/containers.conf}
PACKAGES=(podman runc debootstrap)

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    echo "setup-podman: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Try with the package lists already on disk first: 'apt-get update' costs tens of
    # seconds and is only needed on a machine whose lists are empty or stale.
    if ! as_root apt-get install -y --no-install-recommends "${missing[@]}"; then
        as_root apt-get update
        as_root apt-get install -y --no-install-recommends "${missing[@]}"
    fi
fi

# Edit the TOML line by line with Python's stdlib so settings already in the file are
# kept; only the two keys bakeoff needs are added or corrected.
as_root python3 - "$CONF" <<'PY'
import re
import sys
from pathlib import Path

path = Path(sys.argv[1])
wanted = {"containers": ("default_ulimits", "[]"), "engine": ("runtime", '"runc"')}
lines = path.read_text().splitlines() if path.exists() else []
section = None
seen: dict[str, bool] = {}
out: list[str] = []
changed = False
for line in lines:
    header = re.match(r"\s*\[([^\[\]]+)\]\s*$", line)
    if header:
        section = header.group(1).strip()
        out.append(line)
        if section in wanted and section not in seen:
            seen[section] = False
        continue
    if section in wanted:
        key, value = wanted[section]
        m = re.match(rf"\s*{key}\s*=\s*(.*?)\s*$", line)
        if m:
            seen[section] = True
            if m.group(1) != value:
                line = f"{key} = {value}"
                changed = True
    out.append(line)
# Keys missing from an existing section go right after its header.
for sect, present in seen.items():
    if not present:
        key, value = wanted[sect]
        idx = next(i for i, l in enumerate(out) if re.match(rf"\s*\[{sect}\]\s*$", l))
        out.insert(idx + 1, f"{key} = {value}")
        changed = True
for sect, (key, value) in wanted.items():
    if sect not in seen:
        out += ["", f"[{sect}]", f"{key} = {value}"]
        changed = True
if changed:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out).lstrip("\n") + "\n")
    print(f"setup-podman: wrote {path}")
PY

if ! podman info --format '{{.Host.OCIRuntime.Name}}' >/dev/null 2>&1; then
    echo "setup-podman: 'podman info' fails; see its output:" >&2
    podman info >&2
    exit 1
fi
