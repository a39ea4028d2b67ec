"""The decode roofline: how fast a server could possibly produce tokens, and how close it came.

Decoding one step reads every weight once and the KV cache of every sequence in the
batch, and does little arithmetic per byte read: memory bandwidth, not compute, sets
its floor. So the *decode floor per output token* at batch size ``b`` is::

    floor_s = (weight_bytes + b * context_tokens * kv_bytes_per_token) / bandwidth

and at concurrency 1 a server's *decode efficiency* is ``floor / measured TPOT`` (1.0 =
at the floor; a figure above 1 is physically impossible and means the measurement is
wrong — chunks coalesced, or the wrong bandwidth).

``weight_bytes`` is what the checkpoint's safetensors hold, less the input embedding
table (one row of it is read per token, not all of it); ``kv_bytes_per_token`` is
``2 (K and V) x layers x KV heads x head dim x bytes per value``, from ``config.json``.

Memory bandwidth (:func:`memory_bandwidth_gbs`, :func:`bandwidth`), first match wins:

1. an explicit value (the campaign's ``memory_bandwidth_gbs``);
2. ``$BAKEOFF_MEMORY_BANDWIDTH_GBS``;
3. on a GPU run, the HBM figure of NVIDIA's datasheet for the GPU NVML names
   (:data:`GPU_PRESETS`: A100, H100, H200);
4. on a CPU run, a copy benchmark (numpy, a buffer far larger than the caches copied by
   one thread per core, each its own slice, as STREAM runs one per core: a single thread
   cannot draw a socket's bandwidth, and read 8.5 GB/s on a 2-core host where llama.cpp's
   decode implied 11; best of several passes, read + write bytes counted as STREAM does),
   measured once per machine and cached in the user cache folder
   (``~/.cache/bakeoff/memory_bandwidth.json``; an entry from another method is measured again).
"""

from __future__ import annotations

import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bakeoff.errors import SpecError
from bakeoff.host.gpus import gpu_names as nvml_names
from bakeoff.measure.load_modes import load_level
from bakeoff.paths import models_dir, user_cache_dir
from bakeoff.results.campaign_copy import CampaignCopy
from bakeoff.results.layout import CellResult, load_cells, read_campaign_copy
from bakeoff.results.store import RUN_INFO, atomic_write_bytes, read_json_or_empty

ENV = "BAKEOFF_MEMORY_BANDWIDTH_GBS"
CACHE_FILE = "memory_bandwidth.json"

# (substring of the NVML name, label, GB/s), most specific first. HBM bandwidth from
# NVIDIA's datasheets: A100 40GB 1,555; A100 80GB PCIe 1,935, SXM 2,039; H100 PCIe 2,000,
# SXM 3,350, NVL 3,900; H200 (SXM and NVL) 4,800.
GPU_PRESETS: tuple[tuple[str, str, float], ...] = (
    ("H200", "H200 (HBM3e)", 4800.0),
    ("H100 NVL", "H100 NVL", 3900.0),
    ("H100 PCIE", "H100 PCIe", 2000.0),
    ("H100", "H100 SXM", 3350.0),
    ("A100-SXM4-80GB", "A100 SXM 80GB", 2039.0),
    ("A100 80GB PCIE", "A100 PCIe 80GB", 1935.0),
    ("A100-PCIE-80GB", "A100 PCIe 80GB", 1935.0),
    ("A100", "A100 40GB", 1555.0),
)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class Bandwidth:
    gbs: float
    source: str  # where the figure came from, for the report

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def gpu_preset(name: str) -> tuple[str, float] | None:
    """Datasheet bandwidth for an NVML GPU name ("NVIDIA H100 80GB HBM3"), None if unknown."""
    upper = name.upper()
    for needle, label, gbs in GPU_PRESETS:
        if needle in upper:
            return label, gbs
    return None


COPY_METHOD = "parallel copy"  # cached entries measured otherwise are measured again


def copy_bandwidth_gbs(megabytes: int = 256, passes: int = 6, threads: int | None = None) -> float:
    """Best copy bandwidth over ``passes`` (bytes read + bytes written, per second), ``threads``
    (default: one per core) copying a slice each at once: numpy's copy releases the GIL."""
    threads = threads or os.cpu_count() or 1
    source = np.ones(megabytes * 2**20 // 8, dtype=np.float64)
    target = np.empty_like(source)
    slices = list(zip(np.array_split(target, threads), np.array_split(source, threads), strict=True))
    with ThreadPoolExecutor(threads) as pool:

        def copy_all() -> None:
            for done in [pool.submit(np.copyto, t, s) for t, s in slices]:
                done.result()

        copy_all()  # touch every page first: the first pass would time page faults
        best = float("inf")
        for _ in range(passes):
            began = time.perf_counter()
            copy_all()
            best = min(best, time.perf_counter() - began)
    return 2 * source.nbytes / best / 1e9


def _machine_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()}|{cpu}|{os.cpu_count()}"


def measured_cpu_bandwidth(cache_dir: Path | None = None) -> Bandwidth:
    """This machine's copy bandwidth, measured once and cached."""
    path = (cache_dir or user_cache_dir()) / CACHE_FILE
    key = _machine_key()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key) if isinstance(cached, dict) else None
    if isinstance(entry, dict) and "gbs" in entry and entry.get("method") == COPY_METHOD:
        return Bandwidth(float(entry["gbs"]), f"copy benchmark, cached {entry.get('measured_at', '')}".strip())
    gbs = copy_bandwidth_gbs()
    cached = cached if isinstance(cached, dict) else {}
    cached[key] = {"gbs": gbs, "method": COPY_METHOD, "measured_at": time.strftime("%Y-%m-%d")}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(cached, indent=2).encode())
    return Bandwidth(gbs, "copy benchmark (numpy), measured now")


def _env_override() -> float | None:
    text = os.environ.get(ENV)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{ENV}={text!r}: give the memory bandwidth in GB/s, e.g. {ENV}=3350") from None
    if value <= 0:
        raise SpecError(f"{ENV}={text!r}: the memory bandwidth must be a positive number of GB/s")
    return value


def bandwidth(
    accelerator: Literal["cpu", "gpu"] = "cpu",
    *,
    override: float | None = None,
    gpu_names: list[str] | None = None,
    cache_dir: Path | None = None,
) -> Bandwidth | None:
    """The memory bandwidth a server's decode is bound by, and where the figure came from.

    None on a GPU run whose GPU has no preset (and no override): a guess would be worse.
    """
    if override is not None:
        return Bandwidth(override, "campaign memory_bandwidth_gbs")
    env = _env_override()
    if env is not None:
        return Bandwidth(env, f"${ENV}")
    if accelerator == "gpu":
        if gpu_names is None:
            gpu_names = nvml_names()
        for name in gpu_names:
            preset = gpu_preset(name)
            if preset is not None:
                return Bandwidth(preset[1], f"datasheet: {preset[0]}")
        return None
    return measured_cpu_bandwidth(cache_dir)


def memory_bandwidth_gbs(accelerator: Literal["cpu", "gpu"] = "cpu", override: float | None = None) -> float | None:
    """This machine's memory bandwidth in GB/s for a CPU or a GPU run (see :func:`bandwidth`)."""
    found = bandwidth(accelerator, override=override)
    return found.gbs if found is not None else None


@dataclass(frozen=True)
class ModelShape:
    """What one decode step reads: the weights, and the KV cache per token of context."""

    weight_bytes: int
    kv_bytes_per_token: int

    def step_bytes(self, batch: int, context_tokens: float) -> float:
        return self.weight_bytes + batch * context_tokens * self.kv_bytes_per_token

    def floor_ms(self, bandwidth_gbs: float, batch: int = 1, context_tokens: float = 0.0) -> float:
        """The decode floor per step (= per output token of each sequence), in ms."""
        return self.step_bytes(batch, context_tokens) / (bandwidth_gbs * 1e9) * 1000.0


def model_shape(folder: Path) -> ModelShape | None:
    """Read a Hugging Face folder's config and safetensors; None when either is missing."""
    files = list(folder.glob("*.safetensors"))
    config_path = folder / "config.json"
    if not files or not config_path.is_file():
        return None
    config = json.loads(config_path.read_text())
    config = config.get("text_config", config)  # multimodal configs nest the language model
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    width = _DTYPE_BYTES.get(dtype, 2)
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    layers = int(config["num_hidden_layers"])
    total = sum(f.stat().st_size for f in files)
    # The input embedding table is looked up (one row per token), not streamed.
    embedding = 0 if config.get("tie_word_embeddings") else int(config["vocab_size"]) * int(config["hidden_size"])
    return ModelShape(max(total - embedding * width, 0), 2 * layers * kv_heads * head_dim * width)


# --- a campaign's runs against the floor ----------------------------------------------------


def _model_folder(campaign: CampaignCopy, cell: CellResult) -> Path | None:
    server_path = cell.server.get("model_path")
    if server_path:
        return Path(server_path)
    model = campaign.model
    if isinstance(model, str):
        return models_dir() / model if model in ("tiny", "small") else Path(model)
    if not isinstance(model, dict):
        return None
    if model.get("path"):
        return Path(model["path"])
    return models_dir() / str(model["preset"]) if model.get("preset") else None


def _run_bandwidth(run_dir: Path, accelerator: Literal["cpu", "gpu"], override: float | None) -> Bandwidth | None:
    """The campaign's figure, else the one recorded beside the run, else this machine's."""
    if override is not None:
        return Bandwidth(float(override), "campaign memory_bandwidth_gbs")
    info = read_json_or_empty(run_dir / RUN_INFO)
    recorded = info.get("memory_bandwidth")
    if isinstance(recorded, dict) and recorded.get("gbs"):
        return Bandwidth(float(recorded["gbs"]), str(recorded.get("source", "recorded with the run")))
    return bandwidth(accelerator)


def campaign_roofline(campaign_dir: Path) -> list[dict[str, Any]]:
    """One row per measured concurrency-1 run: its TPOT P50 against the decode floor (the efficiency)."""
    campaign = read_campaign_copy(campaign_dir)
    override = campaign.memory_bandwidth_gbs
    accelerator: Literal["cpu", "gpu"] = "gpu" if campaign.gpu else "cpu"
    rows: list[dict[str, Any]] = []
    shapes: dict[Path, ModelShape | None] = {}
    for cell in load_cells(campaign_dir):
        for run, summary in cell.summaries.items():
            wl = summary.workload
            tpot = summary.latency.tpot_ms.p50
            single_stream = load_level(wl.mode, wl.concurrency, wl.rate) == ("concurrency", 1.0)
            if summary.rehearsal or not single_stream or not tpot or not summary.requests.ok:
                continue
            folder = _model_folder(campaign, cell)
            if folder is not None and folder not in shapes:
                shapes[folder] = model_shape(folder)
            shape = shapes.get(folder) if folder is not None else None
            found = _run_bandwidth(cell.dir / "runs" / run, accelerator, override)
            if shape is None or found is None:
                continue
            ok = summary.requests.ok
            context = summary.tokens.prompt / ok + summary.tokens.completion / ok / 2  # mean context while decoding
            floor = shape.floor_ms(found.gbs, 1, context)
            rows.append(
                {
                    "server": cell.label,
                    "workload": cell.workload,
                    "TPOT P50 ms": tpot,
                    "floor ms": floor,
                    "efficiency": floor / tpot,
                    "implied GB/s": shape.step_bytes(1, context) / (tpot / 1000.0) / 1e9,
                    "bandwidth GB/s": found.gbs,
                    "bandwidth source": found.source,
                    "MB read per step": shape.step_bytes(1, context) / 1e6,
                }
            )
    return rows


def efficiencies(campaign_dir: Path) -> dict[tuple[str, str], float]:
    """(server, workload) -> decode efficiency at concurrency 1, the median over repeats: what labels cite."""
    found: dict[tuple[str, str], list[float]] = {}
    for row in campaign_roofline(campaign_dir):
        found.setdefault((row["server"], row["workload"]), []).append(float(row["efficiency"]))
    return {key: float(np.median(values)) for key, values in found.items()}
