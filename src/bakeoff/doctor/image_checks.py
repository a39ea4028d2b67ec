"""Image names a runtime will pull without guessing: fully qualified, and a pinned digest well formed."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from bakeoff.doctor.problems import Problem
from bakeoff.serving.images import pinned_digest, qualified_image, registry_of
from bakeoff.serving.runtime_facts import RuntimeFacts

if TYPE_CHECKING:
    from bakeoff.doctor.diagnose import DoctorServer

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_images(servers: list[DoctorServer], runtime: RuntimeFacts | None) -> list[Problem]:
    problems = []
    for server in servers:
        spec = server.backend.container
        if spec is None or spec.build is not None:
            continue  # a locally built image is never pulled
        field = f"backends/{server.backend.name}.yaml container.image"
        image = spec.image
        if "${" in image:
            continue  # an unset registry variable: `campaign validate` and `run` name it already
        if registry_of(image) is None:
            podman = runtime is not None and runtime.name == "podman"
            problems.append(
                Problem(
                    field,
                    f"{image} is a short name: podman with enforced short-name resolution refuses it when "
                    "pulling without a TTY, and another registry's image of that name could be taken",
                    f"write it fully qualified: {qualified_image(image)}",
                    "error" if podman else "warning",
                )
            )
        digest = pinned_digest(image)
        if digest is not None and not _DIGEST.match(digest):
            problems.append(
                Problem(
                    field,
                    f"the pull would fail: {digest} is not a sha256 digest",
                    "pin it as name@sha256:<64 hex digits> (what `docker buildx imagetools inspect` prints)",
                )
            )
    return problems
