"""Every doctor check over a campaign's servers: :class:`DoctorServer` in, one-line problems out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bakeoff.backends.spec import BackendSpec, KnobValue
from bakeoff.doctor.host import HostFacts
from bakeoff.doctor.host_checks import check_host, chosen_runtime
from bakeoff.doctor.image_checks import check_images
from bakeoff.doctor.model_checks import check_models
from bakeoff.doctor.problems import Problem


@dataclass(frozen=True)
class DoctorServer:
    """One server as a campaign asks for it: what the checks need, already resolved by the campaign."""

    label: str
    where: str  # servers[i], the campaign field its knobs live under
    backend: BackendSpec  # with the campaign's image tag applied
    knobs: dict[str, KnobValue]
    model_dir: Path | None
    model_field: str  # model.path or servers[i].model_path
    env: dict[str, str] = field(default_factory=dict)  # the rendered launch's environment
    chat_field: str | None = None  # the campaign field that sends chat requests (quality.endpoint), if any

    @property
    def gpu_container(self) -> bool:
        return self.backend.container is not None and self.backend.container.gpus


def diagnose(servers: list[DoctorServer], host: HostFacts) -> list[Problem]:
    """Host, image and model problems, each once, in that order (the host first: nothing runs without it)."""
    runtime = chosen_runtime(host) if any(s.gpu_container for s in servers) else None
    problems = [*check_host(servers, host, runtime), *check_images(servers, runtime), *check_models(servers)]
    return list(dict.fromkeys(problems))
