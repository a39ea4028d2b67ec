"""The checkpoint against what the campaign asks of it: context, chat template, one tokenizer.

- Context: :func:`model_context` is vLLM 0.33's own rule (``vllm/config/model.py``
  ``_get_and_verify_max_len`` and ``derive_max_model_len_and_key``): the smallest of the length
  keys in config.json (``model_max_length`` wins where set), capped by tokenizer_config.json's
  ``model_max_length``, times the RoPE scaling factor for the rope types that do not already
  count it (not su, longrope, llama3, yarn, deepseek_yarn, deepseek_llama_scaling). A
  ``max_model_len`` above it stops vLLM at start unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set
  (SGLang likewise without ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``).
- Chat template: the chat endpoint of every framework renders the checkpoint's template
  (tokenizer_config.json ``chat_template``, or ``chat_template.jinja`` / ``chat_template.json``);
  without one it answers HTTP 400.
- One tokenizer: servers given their own ``model_path`` (a quantized export) must tokenize as
  the main model does, or the same prompt is a different number of tokens on each.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bakeoff.doctor.problems import Problem

if TYPE_CHECKING:
    from bakeoff.doctor.diagnose import DoctorServer

_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_SCALED_ALREADY = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
_LONG_ENV = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_context(model_dir: Path) -> tuple[int, str] | None:
    """The longest context the server accepts for this checkpoint and the config key it comes from."""
    config = _read_json(model_dir / "config.json")
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    found = [(int(text[k]), k) for k in _LENGTH_KEYS if isinstance(text.get(k), int | float)]
    if not found:
        return None
    length, key = min(found)
    if isinstance(text.get("model_max_length"), int | float):
        length, key = int(text["model_max_length"]), "model_max_length"
    tok_max = _read_json(model_dir / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, int | float) and tok_max < length:
        length, key = int(tok_max), "tokenizer_config.json model_max_length"
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict) and "gemma3" not in str(text.get("model_type", "")):
        kind = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if kind not in _SCALED_ALREADY and isinstance(factor, int | float) and factor:
            length, key = int(length * factor), f"{key} x rope_scaling.factor {factor}"
    return length, key


def has_chat_template(model_dir: Path) -> bool:
    if any((model_dir / name).is_file() for name in _TEMPLATE_FILES):
        return True
    return bool(_read_json(model_dir / "tokenizer_config.json").get("chat_template"))


def tokenizer_fingerprint(model_dir: Path) -> str | None:
    """A hash of the tokenizer's vocabulary files (None when the folder has none)."""
    digest = hashlib.sha256()
    seen = False
    for name in _TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
            seen = True
    return digest.hexdigest()[:16] if seen else None


def check_models(servers: list[DoctorServer]) -> list[Problem]:
    problems: list[Problem] = []
    missing: set[Path] = set()
    for server in servers:
        folder = server.model_dir
        if folder is None:
            continue  # a Hugging Face id: fetched by the server itself
        if not (folder / "config.json").is_file():
            if folder not in missing:
                missing.add(folder)
                problems.append(
                    Problem(
                        server.model_field,
                        f"every server would fail to load: {folder} holds no config.json on this host",
                        f"put the Hugging Face checkpoint folder there (config.json, weights, tokenizer), or "
                        f"point {server.model_field} at one",
                    )
                )
            continue
        problems += _context_problem(server, folder)
        if server.chat_field is not None and not has_chat_template(folder):
            problems.append(
                Problem(
                    f"{server.model_field} ({server.label})",
                    f"{server.chat_field} sends chat requests, and the server would answer each with HTTP 400: "
                    f"{folder} has no chat template (tokenizer_config.json chat_template, chat_template.jinja)",
                    "serve an instruct/chat checkpoint that ships one, or send completions instead of chat there",
                )
            )
    problems += _tokenizer_problems([s for s in servers if s.model_dir is not None and s.model_dir not in missing])
    return problems


def _context_problem(server: DoctorServer, folder: Path) -> list[Problem]:
    ask = server.knobs.get("max_model_len")
    context = model_context(folder)
    if ask is None or context is None or isinstance(ask, bool) or not isinstance(ask, int | float):
        return []
    length, key = context
    if ask <= length or any(server.env.get(name) for name in _LONG_ENV):
        return []
    return [
        Problem(
            f"{server.where}.knobs.max_model_len ({server.label})",
            f"{server.backend.name} would refuse to start: max_model_len {int(ask)} is greater than the model's "
            f"{length} ({key} in {folder})",
            f"set max_model_len to {length} or less, or serve a checkpoint whose context is {int(ask)} or more",
        )
    ]


def _tokenizer_problems(servers: list[DoctorServer]) -> list[Problem]:
    prints = {s.label: (s, tokenizer_fingerprint(s.model_dir)) for s in servers if s.model_dir is not None}
    known = {p for _, p in prints.values() if p is not None}
    if len(known) <= 1:
        return []
    first = next(iter(prints.values()))
    return [
        Problem(
            f"{s.model_field} ({label})",
            f"its tokenizer differs from {first[0].label}'s ({s.model_dir} vs {first[0].model_dir}): the same prompt "
            "would be a different number of tokens on each server",
            "export the checkpoint from the same base model with its tokenizer files copied unchanged",
        )
        for label, (s, p) in prints.items()
        if p is not None and p != first[1]
    ]
