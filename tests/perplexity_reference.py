"""The perplexity a served model should give, computed from its own weights in torch.

The tests hold a server's prompt-logprob perplexity (:mod:`bakeoff.campaign.perplexity`) against
this: the same texts, tokenized as vLLM tokenizes a completions prompt (the tokenizer's own
special tokens added), every token after the first scored given the ones before it, in float32.
"""

from __future__ import annotations

import math
from pathlib import Path


def torch_perplexity(model_dir: Path, texts: list[str]) -> tuple[float, int]:
    """(perplexity, scored tokens) of the model in ``model_dir`` over ``texts``, pooled."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            total += float(logprobs.gather(1, ids[0, 1:, None]).sum())
            tokens += ids.shape[1] - 1
    return math.exp(-total / tokens), tokens
