"""Token budgets: every formalizer call must fit the limits of the model that answers it.

A student's limits live in one file, `configs/limits/NAME.yaml` (`StudentLimits`): the training
`max_length`, vLLM's `max_model_len` and each stage's `max_tokens` all derive from it, so they
cannot contradict each other. A stage's prompt budget is what the context leaves after the
stage's completion: `max_length - max_tokens[stage]`.

Tokens are counted with a `TokenCounter`: the model's own tokenizer where it is known (a
`tokenizer.json`), else a deliberately high byte estimate, so an unknown tokenizer errs on the
side of smaller calls.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

# Qwen2.5's ChatML framing: "<|im_start|>ROLE\n" + content + "<|im_end|>\n" per message, and the
# generation prompt "<|im_start|>assistant\n". Counted as fixed overheads (exact for ChatML).
_PER_MESSAGE = 5
_GENERATION_PROMPT = 3


class TokenCounter(Protocol):
    name: str

    def count_text(self, text: str) -> int: ...

    def count_messages(self, messages: list[dict[str, str]]) -> int: ...


class _Counter:
    name = "counter"

    def count_text(self, text: str) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        """Prompt tokens of a chat request, framing and generation prompt included."""
        return sum(self.count_text(m.get("content") or "") + _PER_MESSAGE for m in messages) + _GENERATION_PROMPT


class ByteEstimate(_Counter):
    """An upper estimate with no tokenizer at hand: one token per `bytes_per_token` bytes (3 is
    high for English BPE vocabularies, which average about 4)."""

    def __init__(self, bytes_per_token: float = 3.0):
        self.bytes_per_token = bytes_per_token
        self.name = f"bytes/{bytes_per_token:g}"

    def count_text(self, text: str) -> int:
        return math.ceil(len(text.encode()) / self.bytes_per_token)


class TokenizerCounter(_Counter):
    """Exact counts with a Hugging Face `tokenizer.json` (a model folder or the file itself)."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        self._tok = Tokenizer.from_file(str(file))
        self.name = f"tokenizer:{file.parent.name or file.name}"

    def count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


def counter_for(tokenizer: str | Path | None) -> TokenCounter:
    """The counter for an endpoint: its tokenizer if configured, else the byte estimate."""
    if tokenizer is None:
        return ByteEstimate()
    return TokenizerCounter(tokenizer)
