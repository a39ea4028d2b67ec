"""Ready-to-use schedules for re-running a campaign: GitHub Actions, systemd, cron.

``bakeoff schedule print --campaign FILE --every 1w`` renders three ways to run a campaign
on a schedule, each doing the same steps:

1. ``bakeoff campaign run FILE --fresh --out reports/NAME`` (``--fresh``: a scheduled run
   measures everything again; a run killed mid-way is resumed by running the same
   command without ``--fresh``),
2. ``bakeoff compare reports/NAME --baseline baseline --or-set-baseline``, whose non-zero
   exit on a regression fails the run; the first run, which has no baseline to be judged
   against, becomes the baseline instead,
3. keep the report (an uploaded artifact in the workflow; the folder on disk otherwise).

The workflow runs on a self-hosted runner (labels ``self-hosted, linux``, plus ``gpu``
for a GPU campaign): the engines, models and GPUs live there, not on hosted runners.
The systemd service stops bakeoff with SIGINT, which ends the running cell cleanly
(:mod:`bakeoff.notebook.kernelrun`). Everything is rendered from the campaign's name and path
only, so the files are the same wherever they are generated (``examples/schedules/``
holds them for ``campaigns/cpu-demo.yaml``).

``bakeoff schedule print --drift --every 1w`` renders the same three for a *drift audit*
instead: ``bakeoff backends audit NAME --wheel DIST --missing-only`` for every shipped
backend whose framework publishes a wheel, against the newest release on the index (a bare
distribution name), failing when a flag, metric or endpoint bakeoff uses is gone or a
default bakeoff declares has moved (``examples/schedules/`` holds them as ``bakeoff-drift``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from bakeoff.backends.spec import list_backends, load_backend
from bakeoff.campaign.specs import load_campaign
from bakeoff.errors import SpecError
from bakeoff.results.store import atomic_write_bytes

EVERY_FORMS = "Nh (N dividing 24: 1h, 6h, 12h), 1d, or 1w"
# Where GitHub reads workflows from, leading dot included (copy the folder into your repository as it is).
WORKFLOWS = ".github/workflows"
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class Cadence:
    """One schedule in both notations: cron (workflow, crontab) and systemd ``OnCalendar``."""

    cron: str
    on_calendar: str
    words: str  # "weekly", "daily", "every 6 hours"


def parse_every(every: str, at: str = "03:00", weekday: str = "Mon") -> Cadence:
    """``--every`` (with ``--at HH:MM`` for daily and weekly runs, ``--weekday`` for weekly ones)."""
    match = re.fullmatch(r"(\d+)([hdw])", every.strip())
    time_match = re.fullmatch(r"([01]\d|2[0-3]):([0-5]\d)", at)
    if time_match is None:
        raise SpecError(f"--at must be HH:MM (24-hour), got {at!r}")
    if weekday not in WEEKDAYS:
        raise SpecError(f"--weekday must be one of {', '.join(WEEKDAYS)}, got {weekday!r}")
    hour, minute = int(time_match.group(1)), int(time_match.group(2))
    if match is None:
        raise SpecError(f"--every must be {EVERY_FORMS}; got {every!r}")
    count, unit = int(match.group(1)), match.group(2)
    if unit == "h" and count >= 1 and 24 % count == 0:
        hours = "*" if count == 1 else f"*/{count}"
        words = "hourly" if count == 1 else f"every {count} hours"
        return Cadence(f"{minute} {hours} * * *", f"*-*-* 00/{count}:{minute:02d}:00", words)
    if unit == "d" and count == 1:
        return Cadence(f"{minute} {hour} * * *", f"*-*-* {hour:02d}:{minute:02d}:00", "daily")
    if unit == "w" and count == 1:
        cron_day = (WEEKDAYS.index(weekday) + 1) % 7  # cron: 0 is Sunday
        return Cadence(f"{minute} {hour} * * {cron_day}", f"{weekday} *-*-* {hour:02d}:{minute:02d}:00", "weekly")
    raise SpecError(f"--every {every!r} has no exact cron form; use {EVERY_FORMS}")


@dataclass(frozen=True)
class Job:
    """What a scheduled run does, as shell commands relative to the checkout."""

    name: str
    campaign: str  # path relative to the checkout, as given
    gpu: bool
    install: str = "make venv models"
    bakeoff: str = ".venv/bin/bakeoff"

    @property
    def report_dir(self) -> str:
        return f"reports/{self.name}"

    @property
    def run(self) -> str:
        return shlex.join([self.bakeoff, "campaign", "run", self.campaign, "--fresh", "--out", self.report_dir])

    @property
    def compare(self) -> str:
        # The first scheduled run has nothing to compare with: it sets the baseline instead of failing.
        return shlex.join([self.bakeoff, "compare", self.report_dir, "--baseline", "baseline", "--or-set-baseline"])


def job_for(campaign: Path) -> Job:
    """The job for a campaign file (validated: a schedule of a broken campaign would fail weekly)."""
    spec = load_campaign(campaign)
    # llama.cpp's server is built from source once (cached); only campaigns that use it need it.
    targets = "venv models" + (" llamacpp" if any(s.backend == "llamacpp" for s in spec.servers) else "")
    return Job(name=spec.name, campaign=campaign.as_posix(), gpu=spec.gpu, install=f"make {targets}")


@dataclass(frozen=True)
class DriftJob:
    """The weekly audit of every shipped backend against its framework's newest wheel."""

    audits: tuple[tuple[str, str], ...]  # (backend, distribution)
    name: str = "drift"
    install: str = "make venv"
    bakeoff: str = ".venv/bin/bakeoff"

    def command(self, backend: str, distribution: str) -> str:
        # A bare distribution name: the newest release on the index, downloaded afresh.
        return shlex.join([self.bakeoff, "backends", "audit", backend, "--wheel", distribution, "--missing-only"])

    @property
    def commands(self) -> list[str]:
        return [self.command(b, d) for b, d in self.audits]


def drift_job() -> DriftJob:
    """Every shipped backend whose YAML names a wheel (TensorRT-LLM's has none: pre-flight covers it)."""
    audits = []
    for name in list_backends():
        spec = load_backend(name).audit
        if spec is not None and spec.distribution is not None:
            audits.append((name, spec.distribution))
    return DriftJob(tuple(audits))


def drift_workflow(job: DriftJob, cadence: Cadence) -> str:
    steps: list[dict[str, object]] = [
        {"uses": "actions/checkout@v4"},
        {"name": "Install (a no-op once set up)", "run": job.install},
    ]
    # Every backend is audited even after one fails; the job then fails.
    for (backend, _), command in zip(job.audits, job.commands, strict=True):
        steps.append({"name": f"Audit {backend} against the newest release", "if": "always()", "run": command})
    workflow = {
        "name": f"bakeoff {job.name} audit ({cadence.words})",
        "on": {"schedule": [{"cron": cadence.cron}], "workflow_dispatch": {}},
        "concurrency": {"group": f"bakeoff-{job.name}", "cancel-in-progress": False},
        "jobs": {"audit": {"runs-on": ["self-hosted", "linux"], "timeout-minutes": 60, "steps": steps}},
    }
    header = (
        "# Fails when a flag, metric or endpoint a bakeoff backend uses is gone from a newer release,\n"
        "# or a default it declares has moved.\n"
    )
    return header + yaml.safe_dump(workflow, sort_keys=False, width=200)


def render_drift(every: str, *, at: str = "03:00", weekday: str = "Mon", workdir: str) -> dict[str, str]:
    """The drift audit's files, named and stamped like a campaign's."""
    job = drift_job()
    cadence = parse_every(every, at, weekday)
    command = ["bakeoff", "schedule", "print", "--drift", "--every", every, "--at", at]
    command += ["--weekday", weekday, "--workdir", workdir]
    stamp = f"# Generated by: {shlex.join(command)}\n"
    description = f"bakeoff drift audit of {', '.join(b for b, _ in job.audits)}"
    files = {
        f"{WORKFLOWS}/bakeoff-{job.name}.yml": drift_workflow(job, cadence),
        f"systemd/bakeoff-{job.name}.service": _service(description, job.commands, workdir, "1h"),
        f"systemd/bakeoff-{job.name}.timer": systemd_timer(Job(job.name, "", False), cadence),
        f"cron/bakeoff-{job.name}.crontab": _cron(job.name, cadence, workdir, job.commands),
    }
    return {name: stamp + body for name, body in files.items()}


def github_workflow(job: Job, cadence: Cadence) -> str:
    runner = ["self-hosted", "linux", "gpu"] if job.gpu else ["self-hosted", "linux"]
    workflow = {
        "name": f"bakeoff {job.name} ({cadence.words})",
        "on": {"schedule": [{"cron": cadence.cron}], "workflow_dispatch": {}},
        "concurrency": {"group": f"bakeoff-{job.name}", "cancel-in-progress": False},
        "jobs": {
            "bakeoff": {
                "runs-on": runner,
                "timeout-minutes": 720,
                "steps": [
                    {"uses": "actions/checkout@v4"},
                    {"name": "Install (a no-op once set up)", "run": job.install},
                    {"name": f"Run campaign {job.name}", "run": job.run},
                    {
                        "name": "Compare against the baseline (the first run sets it; fails on a regression)",
                        "run": job.compare,
                    },
                    {
                        "name": "Upload the report",
                        "if": "always()",
                        "uses": "actions/upload-artifact@v4",
                        "with": {
                            "name": f"bakeoff-{job.name}-${{{{ github.run_id }}}}",
                            "path": job.report_dir,
                            "if-no-files-found": "warn",
                        },
                    },
                ],
            }
        },
    }
    header = "# Runs on a self-hosted runner where the engines, models (and GPUs) are.\n"
    return header + yaml.safe_dump(workflow, sort_keys=False, width=200)


def systemd_service(job: Job, workdir: str) -> str:
    return _service(f"bakeoff campaign {job.name}", [job.run, job.compare], workdir, "12h")


def _service(description: str, commands: list[str], workdir: str, timeout: str) -> str:
    starts = "".join(f"ExecStart={workdir}/{command}\n" for command in commands)
    return f"""\
[Unit]
Description={description}
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
WorkingDirectory={workdir}
{starts}# SIGINT stops the running cell cleanly: its server torn down, what it measured kept.
KillSignal=SIGINT
TimeoutStopSec=120
TimeoutStartSec={timeout}
"""


def systemd_timer(job: Job, cadence: Cadence) -> str:
    return f"""\
[Unit]
Description=Run bakeoff campaign {job.name} {cadence.words}

[Timer]
OnCalendar={cadence.on_calendar}
Persistent=true
Unit=bakeoff-{job.name}.service

[Install]
WantedBy=timers.target
"""


def crontab_line(job: Job, cadence: Cadence, workdir: str) -> str:
    """One line: flock keeps runs from overlapping; the log sits beside the reports."""
    return _cron(job.name, cadence, workdir, [job.run, job.compare])


def _cron(name: str, cadence: Cadence, workdir: str, commands: list[str]) -> str:
    script = " && ".join([f"cd {shlex.quote(workdir)}", *commands])
    log = f"{workdir}/reports/{name}.cron.log"
    lock = f"/tmp/bakeoff-{name}.lock"
    return f"{cadence.cron} flock -n {lock} sh -c {shlex.quote(script)} >> {shlex.quote(log)} 2>&1\n"


def render(campaign: Path, every: str, *, at: str = "03:00", weekday: str = "Mon", workdir: str) -> dict[str, str]:
    """File name -> content of every schedule, in the order they are printed."""
    job = job_for(campaign)
    cadence = parse_every(every, at, weekday)
    command = ["bakeoff", "schedule", "print", "--campaign", job.campaign, "--every", every, "--at", at]
    command += ["--weekday", weekday, "--workdir", workdir]
    stamp = f"# Generated by: {shlex.join(command)}\n"
    files = {
        f"{WORKFLOWS}/bakeoff-{job.name}.yml": github_workflow(job, cadence),
        f"systemd/bakeoff-{job.name}.service": systemd_service(job, workdir),
        f"systemd/bakeoff-{job.name}.timer": systemd_timer(job, cadence),
        f"cron/bakeoff-{job.name}.crontab": crontab_line(job, cadence, workdir),
    }
    return {name: stamp + body for name, body in files.items()}


def as_text(files: dict[str, str]) -> str:
    """Every file under a ``==> NAME <==`` header, as ``tail`` prints several files."""
    return "\n".join(f"==> {name} <==\n{body}" for name, body in files.items())


def write(files: dict[str, str], out: Path) -> list[Path]:
    written = []
    for name, body in files.items():
        atomic_write_bytes(out / name, body.encode())
        written.append(out / name)
    return written
