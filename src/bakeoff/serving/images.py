"""Container images: present or pulled (timed), their digests and recorded build times.

A registry image that is missing, or on a floating tag (``latest``), is pulled before a
run, and the pull time goes to ``images.json`` beside the local build times that
scripts/build-images.sh records; the effort table reads both. The digest returned is
what a run records, so a report names exactly the image that ran.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from bakeoff.console import working
from bakeoff.errors import LaunchError
from bakeoff.paths import user_cache_dir
from bakeoff.results.store import atomic_write_bytes
from bakeoff.serving.container_runtime import runtime_cli

LOCAL_IMAGE_PREFIX = "localhost/bakeoff/"
# Multi-GB serving images take a while on a slow link; a hung pull still ends.
_PULL_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ImageInfo:
    """What is known about one image: its digest pins what a run actually used."""

    image: str
    digest: str
    build_s: float | None
    present: bool


def cache_file() -> Path:
    """``images.json`` written by scripts/build-images.sh: image tag -> build seconds."""
    return user_cache_dir() / "images.json"


def recorded_build_s(image: str) -> float | None:
    """Seconds the last local build of ``image`` took, or None when it was not built here."""
    try:
        entry = json.loads(cache_file().read_text()).get(image)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(entry, dict) and isinstance(entry.get("build_s"), int | float):
        return float(entry["build_s"])
    return None


def record_image_seconds(image: str, seconds: float, how: str) -> None:
    """Add an image's build or pull time to ``images.json`` (the effort table reads it)."""
    path = cache_file()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[image] = {"build_s": round(seconds, 1), "how": how}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def image_with_tag(image: str, tag: str) -> str:
    """``image`` with its tag replaced by ``tag`` (a digest reference keeps its name only)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return f"{name}:{tag}"


# Docker's own default registry, what a short name means to docker; podman asks (a TTY) or,
# with short-name-mode "enforcing" and no TTY, refuses it.
DEFAULT_REGISTRY = "docker.io"


def registry_of(image: str) -> str | None:
    """The registry host an image names (``localhost``, ``host:port``, ``a.b``), or None for a short name.

    Docker's rule: the first path component is a registry when it has a dot or a colon or is
    ``localhost``; ``vllm/vllm-openai`` has none, so it is a short name.
    """
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or "${" in first):
        return first
    return None


def qualified_image(image: str) -> str:
    """``image`` with the registry docker would read into a short name, so no runtime has to guess it."""
    if registry_of(image) is not None:
        return image
    return (
        f"{DEFAULT_REGISTRY}/{image}"
        if "/" in image.split("@", 1)[0].split(":", 1)[0]
        else f"{DEFAULT_REGISTRY}/library/{image}"
    )


def pinned_digest(image: str) -> str | None:
    """The ``sha256:...`` an image reference pins (``name@sha256:...``), or None."""
    return image.split("@", 1)[1] if "@" in image else None


def floating_tag(image: str) -> bool:
    """A tag that moves (``latest``, or none at all): pulled again on every run."""
    if "@" in image:
        return False
    last = image.rsplit("/", 1)[-1]
    return ":" not in last or last.endswith(":latest")


def ensure_image(runtime: str, image: str, *, build: str | None = None) -> ImageInfo:
    """The local image; a registry image that is missing, or floating (``latest``), is pulled first, timed.

    Locally built images (``build`` set) are never built implicitly: that takes minutes
    and its own script, which the error names. The returned digest is what will run.
    """
    info = inspect_image(runtime, image, build=build, missing_ok=True)
    local = build is not None or image.startswith(LOCAL_IMAGE_PREFIX)
    if local or (info.present and not floating_tag(image)):
        return inspect_image(runtime, image, build=build)

    started = time.monotonic()
    # Pulled by its fully qualified name: podman's enforced short-name resolution refuses a
    # short one without a TTY, and this pull has none.
    source = qualified_image(image)
    with working(f"pulling {source}"):
        pulled = runtime_cli(runtime, "pull", source, timeout_s=_PULL_TIMEOUT_S)
    if pulled.returncode != 0:
        raise LaunchError(f"`{runtime} pull {source}` failed: {pulled.stderr.strip()[-1500:]}")
    record_image_seconds(image, time.monotonic() - started, "pull")
    return inspect_image(runtime, image, build=build)


def image_fix_hint(runtime: str, image: str, build: str | None = None) -> str:
    """The command that makes ``image`` present: a local build, or a pull for registry images."""
    if build is None and image.startswith(LOCAL_IMAGE_PREFIX):
        build = image.removeprefix(LOCAL_IMAGE_PREFIX).split(":", 1)[0]
    if build is not None:
        return f"scripts/build-images.sh {build}"
    return f"{runtime} pull {image}"


def inspect_image(runtime: str, image: str, *, build: str | None = None, missing_ok: bool = False) -> ImageInfo:
    """Digest and recorded build time of a local image.

    A missing image raises :class:`LaunchError` naming the command that provides it,
    unless ``missing_ok`` (then ``present`` is False).
    """
    proc = runtime_cli(runtime, "image", "inspect", image)
    if proc.returncode != 0:
        if missing_ok:
            return ImageInfo(image=image, digest="", build_s=None, present=False)
        raise LaunchError(
            f"container image {image} is not present for {runtime}; "
            f"get it with: {image_fix_hint(runtime, image, build)}"
        )
    try:
        data = json.loads(proc.stdout)
        entry = data[0] if isinstance(data, list) else data
    except (ValueError, IndexError, KeyError) as exc:
        raise LaunchError(f"`{runtime} image inspect {image}` gave unreadable output") from exc
    return ImageInfo(image=image, digest=_digest_of(entry), build_s=recorded_build_s(image), present=True)


def _digest_of(entry: dict[str, object]) -> str:
    # A pulled image has a registry digest; a locally built one only its content ID
    # (podman fills Digest for both, docker only RepoDigests).
    digest = entry.get("Digest")
    if isinstance(digest, str) and digest:
        return digest
    repo_digests = entry.get("RepoDigests")
    if isinstance(repo_digests, list) and repo_digests:
        return str(repo_digests[0]).rpartition("@")[2]
    image_id = str(entry.get("Id", ""))
    return image_id if image_id.startswith("sha256:") or not image_id else f"sha256:{image_id}"
