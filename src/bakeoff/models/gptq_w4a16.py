"""A W4A16 checkpoint by GPTQ with llm-compressor, run by the quantization environment (.venv-quant).

This file is a script, not a harness module: it imports nothing of bakeoff (llm-compressor's
pins differ from the harness's and from the engine's, so it has its own environment, made by
``scripts/bootstrap.sh quant``). :mod:`bakeoff.models.quantized` runs it as

    .venv-quant/bin/python gptq_w4a16.py MODEL_DIR OUT_DIR CALIBRATION_JSONL

where the calibration file holds one ``{"text": ...}`` per line (documents of the model's own
training text). It writes a compressed-tensors checkpoint (``pack-quantized``: 4-bit integer
weights in groups of 128 with bf16 scales, activations 16-bit; ``lm_head`` kept) that vLLM
loads as WNA16, and prints one JSON line: what it did and how long it took.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(model_dir: str, out_dir: str, calibration: str) -> None:
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
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
    oneshot(model=model, dataset=dataset, recipe=recipe, max_seq_length=max_len, num_calibration_samples=len(texts))
    model.save_pretrained(out_dir, save_compressed=True)
    tokenizer.save_pretrained(out_dir)
    print(
        json.dumps(
            {
                "method": "GPTQ (llm-compressor)",
                "scheme": "W4A16",
                "calibration_samples": len(texts),
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
