"""Convert a Hugging Face model folder to GGUF for llama.cpp, cached beside the model.

llama.cpp serves GGUF files only, so the launcher converts the HF folder first with the
converter vendored in the same llama.cpp tree the ``llama-server`` binary was built from
(``scripts/install-llamacpp.sh`` installs both under ``.venv/opt/llamacpp``).

The converter names a BPE tokenizer's pre-tokenizer ("tokenizer.ggml.pre") by hashing
the token ids it produces for a fixed probe string, and refuses hashes it does not know.
The hash covers the vocabulary too, so every freshly trained tokenizer -- bakeoff's own
models included -- is unknown however ordinary its pre-tokenizer is. Rather than patch
the vendored file, conversion runs through a small wrapper (``python -m bakeoff.models.gguf``)
that keeps the converter's own answer whenever it has one and, only when it has none,
reads the pre-tokenizer from ``tokenizer.json``: a lone ByteLevel pre-tokenizer with the
GPT-2 split regex and no normalizer is exactly llama.cpp's ``gpt-2`` pre-tokenizer, by
definition, not by guess. Anything else still fails with the converter's message.

Quantized weights (the ``quantization`` knob of the llamacpp backend) are made the way
llama.cpp users make them: ``llama-quantize`` (built beside the server) rewrites the bf16
GGUF as Q8_0, Q4_K_M or Q4_0, cached beside it as ``model-<type>.gguf``
(:func:`gguf_for_quantization`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bakeoff.errors import LaunchError

log = logging.getLogger(__name__)

OUTTYPES = ("bf16", "f16", "f32", "q8_0")
# The quantization knob's values -> llama-quantize's type names (tools/quantize/quantize.cpp).
QUANT_TYPES = {"q8_0": "Q8_0", "q4_k_m": "Q4_K_M", "q4_0": "Q4_0"}
# Files whose change makes a converted GGUF stale.
_INPUTS = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def llamacpp_home() -> Path:
    """Where install-llamacpp.sh put llama.cpp: inside the running virtual environment."""
    override = os.environ.get("BAKEOFF_LLAMACPP_HOME")
    return Path(override) if override else Path(sys.prefix) / "opt" / "llamacpp"


def llama_server_path() -> Path:
    """The native llama-server binary (it may not exist; callers check)."""
    return llamacpp_home() / "bin" / "llama-server"


def llama_quantize_path() -> Path:
    return llamacpp_home() / "bin" / "llama-quantize"


def converter_path() -> Path:
    return llamacpp_home() / "convert" / "convert_hf_to_gguf.py"


def default_gguf_path(model_dir: Path, outtype: str = "bf16") -> Path:
    # A subfolder, so HF loaders that glob the model folder never see the GGUF.
    return model_dir / "gguf" / f"model-{outtype}.gguf"


def gguf_is_fresh(model_dir: Path, out: Path) -> bool:
    """True when ``out`` exists and is newer than the weights, tokenizer, config and converter."""
    if not out.is_file():
        return False
    inputs = [*model_dir.glob("*.safetensors"), *(model_dir / n for n in _INPUTS), converter_path()]
    newest = max((p.stat().st_mtime for p in inputs if p.is_file()), default=0.0)
    return out.stat().st_mtime > newest


def convert_to_gguf(model_dir: Path, out: Path | None = None, outtype: str = "bf16") -> Path:
    """Convert ``model_dir`` to GGUF (or reuse a fresh earlier conversion) and return its path.

    ``bf16`` keeps the checkpoint's own bf16 weights bit for bit, so llama.cpp computes with
    the same numbers vLLM loads. The file is written under a temporary name and renamed, so
    an interrupted conversion never leaves a file that looks fresh.
    """
    if outtype not in OUTTYPES:
        choices = ", ".join(OUTTYPES)
        raise LaunchError(f"GGUF outtype {outtype!r} not supported; choose one of: {choices}")
    model_dir = model_dir.resolve()
    if not (model_dir / "config.json").is_file():
        raise LaunchError(f"{model_dir} has no config.json; point at a Hugging Face model folder")
    target = (out or default_gguf_path(model_dir, outtype)).resolve()
    if gguf_is_fresh(model_dir, target):
        log.info("GGUF up to date: %s", target)
        return target
    converter = converter_path()
    if not converter.is_file():
        raise LaunchError(
            f"llama.cpp's HF->GGUF converter is not installed at {converter}; run scripts/install-llamacpp.sh"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # Per-process temporary name: two runs converting the same model do not collide, and
    # the rename below is atomic, so readers see either no file or a whole one.
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    log_path = target.with_name(target.name + ".convert.log")
    argv = [
        sys.executable,
        "-m",
        "bakeoff.models.gguf",
        str(converter),
        str(model_dir),
        "--outfile",
        str(partial),
        "--outtype",
        outtype,
    ]
    started = time.monotonic()
    with open(log_path, "wb") as sink:
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise LaunchError(f"GGUF conversion of {model_dir} failed (log {log_path}):\n{tail}")
    partial.replace(target)
    seconds = time.monotonic() - started
    # Kept beside the file so a cached conversion still reports what it cost (effort table).
    target.with_name(target.name + ".seconds").write_text(f"{seconds:.3f}\n")
    log.info("converted %s -> %s in %.1f s", model_dir, target, seconds)
    return target


def quantized_gguf_path(model_dir: Path, quantization: str) -> Path:
    return model_dir / "gguf" / f"model-{quantization}.gguf"


def quantize_gguf(source: Path, target: Path, quantization: str) -> Path:
    """``llama-quantize`` ``source`` (a bf16 GGUF) into ``target``, reused while newer than source."""
    if quantization not in QUANT_TYPES:
        raise LaunchError(f"quantization {quantization!r} not supported; choose one of: {', '.join(QUANT_TYPES)}")
    tool = llama_quantize_path()
    if target.is_file() and target.stat().st_mtime > max(source.stat().st_mtime, _mtime(tool)):
        log.info("quantized GGUF up to date: %s", target)
        return target
    if not tool.is_file():
        raise LaunchError(f"llama-quantize is not installed at {tool}; run scripts/install-llamacpp.sh")
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    log_path = target.with_name(target.name + ".quantize.log")
    started = time.monotonic()
    with open(log_path, "wb") as sink:
        done = subprocess.run(
            [str(tool), str(source), str(partial), QUANT_TYPES[quantization]],
            stdout=sink,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise LaunchError(f"llama-quantize {source} -> {quantization} failed (log {log_path}):\n{tail}")
    partial.replace(target)
    target.with_name(target.name + ".seconds").write_text(f"{time.monotonic() - started:.3f}\n")
    return target


def gguf_for_quantization(model_dir: Path, quantization: str = "none") -> Path:
    """The GGUF a llama.cpp server reads for this ``quantization`` knob value: the bf16
    conversion (``none``), or that conversion quantized by ``llama-quantize``; both cached."""
    bf16 = convert_to_gguf(model_dir)
    if quantization == "none":
        return bf16
    return quantize_gguf(bf16, quantized_gguf_path(bf16.parent.parent, quantization), quantization)


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each type a GGUF holds (``{"Q4_0": 14, "Q6_K": 1, "F32": 5}``): the
    effective weight types, since llama-quantize falls back to another type for tensors whose
    rows do not fit the asked one's block (Q4_K needs rows of 256: a 128-wide model gets Q5_0)."""
    # gguf (the modelgen extra; install-llamacpp.sh puts the vendored copy beside the converter) is
    # needed only where a GGUF is read, not by every bakeoff command.
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(str(path)).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _mtime(path: Path) -> float:
    return path.stat().st_mtime if path.is_file() else 0.0


def conversion_seconds(gguf_path: Path) -> float | None:
    """How long the conversion that made ``gguf_path`` took, when it was recorded."""
    try:
        return float(gguf_path.with_name(gguf_path.name + ".seconds").read_text())
    except (OSError, ValueError):
        return None


# --- the converter wrapper; runs in a child process (python -m bakeoff.models.gguf CONVERTER ARGS) ---


def pre_tokenizer_from_config(tokenizer_json: Path) -> str | None:
    """llama.cpp's pre-tokenizer name implied by a tokenizer.json, or None when unsure.

    Only the one case bakeoff needs is recognised: byte-level BPE whose whole
    pre-tokenization is ``ByteLevel(use_regex=True)`` (the GPT-2 split regex, which
    llama.cpp's ``gpt-2`` pre-type implements) with no normalizer. ``add_prefix_space``
    must be false: the GPT-2 pre-type adds no space.
    """
    try:
        spec: dict[str, Any] = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if spec.get("normalizer") is not None or model.get("type") != "BPE":
        return None
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    is_gpt2 = (
        pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True) is True
        and pre.get("add_prefix_space", False) is False
    )
    return "gpt-2" if is_gpt2 else None


def _fallback_pre(original: Callable[..., str], hf_logger: logging.Logger) -> Callable[..., str]:
    """Wrap the converter's hash lookup: its answer first, the tokenizer.json reading second."""

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        # The converter logs a large warning box before raising; keep it out of the log
        # unless the fallback below cannot help either (then the error is re-raised as is).
        name = pre_tokenizer_from_config(Path(self.dir_model) / "tokenizer.json")
        previous = hf_logger.level
        if name is not None:
            hf_logger.setLevel(logging.ERROR)
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if name is None:
                raise
        finally:
            hf_logger.setLevel(previous)
        hf_logger.info(
            "pre-tokenizer hash unknown; tokenizer.json is plain GPT-2 byte-level, so tokenizer.ggml.pre = %r",
            name,
        )
        return name

    return get_vocab_base_pre


def _run_converter(argv: list[str]) -> None:
    converter = Path(argv[0])
    # The converter imports its sibling `conversion` package (and adds `gguf-py` itself).
    sys.path.insert(0, str(converter.parent))
    sys.argv = [str(converter), *argv[1:]]
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", converter)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {converter}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = importlib.import_module("conversion.base")
    text_model = base.TextModel
    text_model.get_vocab_base_pre = _fallback_pre(text_model.get_vocab_base_pre, logging.getLogger("hf-to-gguf"))
    module.main()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m bakeoff.models.gguf CONVERTER.py MODEL_DIR [converter args]")
    _run_converter(sys.argv[1:])
