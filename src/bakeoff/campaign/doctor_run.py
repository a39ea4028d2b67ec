"""``bakeoff doctor [CAMPAIGN]`` and the doctor step of ``campaign run``: a campaign's servers handed to the checks.

:func:`doctor_servers` turns a campaign into :class:`bakeoff.doctor.diagnose.DoctorServer` (backend
with the campaign's image tag, knobs with pins, model folder, launch environment, the field that
sends chat requests); :func:`run_doctor` checks them against a host (live, or a recorded folder)
and :func:`refuse_on_problems` stops ``campaign run`` before any image is pulled.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bakeoff.backends.knobs import apply_pins
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.cells import with_image_tag
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.doctor.diagnose import DoctorServer, diagnose
from bakeoff.doctor.host import HostOutputs, read_live
from bakeoff.doctor.problems import Problem, errors
from bakeoff.errors import SpecError


def chat_field(spec: CampaignSpec) -> str | None:
    """The first campaign field that sends chat requests (the quality set, or a workload), if any."""
    if spec.quality is not None and spec.quality.endpoint == "chat":
        return "quality.endpoint (chat)"
    for j, wl in enumerate(spec.workloads):
        if getattr(wl, "endpoint", None) == "chat":
            return f"workloads[{j}] ({wl.label}) on the chat endpoint"
    return None


def doctor_servers(spec: CampaignSpec) -> list[DoctorServer]:
    """The campaign's servers as the checks see them (local model folders only: a Hugging Face id is fetched)."""
    backends = [
        with_image_tag(load_backend(s.backend), s.image_tag, f"servers[{i}].image_tag")
        for i, s in enumerate(spec.servers)
    ]
    knobs = apply_pins([(b, dict(s.knobs)) for b, s in zip(backends, spec.servers, strict=True)])
    chat = chat_field(spec)
    servers = []
    for i, (server, backend, set_knobs) in enumerate(zip(spec.servers, backends, knobs, strict=True)):
        if server.url is not None:
            continue  # a server bakeoff does not start
        launch = render_launch(backend, set_knobs, model="/model", served_model_name="m", port=8000)
        model_dir, field = (
            (server.model_path, f"servers[{i}].model_path")
            if server.model_path
            else (
                spec.model.path,
                "model.path",
            )
        )
        servers.append(
            DoctorServer(
                label=server.label,
                where=f"servers[{i}]",
                backend=backend,
                knobs=dict(launch.knobs),
                model_dir=Path(model_dir) if model_dir is not None else None,
                model_field=field,
                env=dict(launch.env),
                chat_field=chat,
            )
        )
    return servers


def run_doctor(path: Path | None, host: HostOutputs | None = None) -> list[Problem]:
    """The campaign's problems on this host (or on a recorded one); the host's alone without a campaign."""
    host = host if host is not None else read_live()
    facts = host.facts()
    if path is None:
        gpu_backends = [load_backend(n) for n in ("vllm", "sglang", "trtllm")]
        servers = [DoctorServer(b.name, f"backends/{b.name}.yaml", b, {}, None, "model.path") for b in gpu_backends]
        return diagnose(servers, facts)
    spec = load_campaign(path)
    if not spec.gpu:
        return []  # CPU campaigns run on this host's processes and containers, checked as they start
    return diagnose(doctor_servers(spec), facts)


def refuse_on_problems(problems: list[Problem], path: Path) -> None:
    """Print every problem; stop before any pull when one is an error."""
    for problem in problems:
        print(f"doctor: {problem.line()}", file=sys.stderr)
    stopping = errors(problems)
    if stopping:
        raise SpecError(
            f"bakeoff doctor found {len(stopping)} problem(s) that would stop {path} on this host (listed above); "
            "fix them, or run `bakeoff doctor " + str(path) + "` again to check"
        )
