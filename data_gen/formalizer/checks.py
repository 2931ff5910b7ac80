"""Checks shared by every formalizer stage: JSON parsing and the output model (`parse_output`),
verbatim-quote matching, the core's output schemas, the rejection categories."""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from verdict.core.errors import describe_validation_error
from verdict.core.schemas import json_schema

from .protocol import StageResult

# Rejection categories, most fundamental first: a result's reason is its first problem's category.
REASONS = (
    "empty",
    "truncated",
    "json",
    "schema",
    "undeclared_atom",
    "program",
    "unsatisfiable",
    "coverage",
    "type",
    "evidence",
    "consistency",
    "decision",
    "unsupported_number",
)
SIDES = ("inclusion", "exclusion")
M = TypeVar("M", bound=BaseModel)


@functools.lru_cache(maxsize=8)
def core_schema(name: str) -> dict:
    """The core's JSON Schema for structured outputs ("parsed-trial" | "value-miner"); the core
    writes it in a form xgrammar compiles. Shared: do not mutate."""
    return json_schema(name)


def normalize_ws(text: str) -> str:
    return " ".join(text.split())


_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)\s*")


_QUOTE_MARKS = "\"'“”‘’"


def split_pieces(quote: str) -> list[str]:
    """The pieces of an evidence quote (joined by '...'), whitespace-normalized, empty ones left out;
    one pair of quotation marks around the whole quote is not part of it."""
    quote = quote.strip()
    if len(quote) >= 2 and quote[0] in _QUOTE_MARKS and quote[-1] in _QUOTE_MARKS:
        quote = quote[1:-1]
    return [p for p in (normalize_ws(x) for x in _ELLIPSIS.split(quote)) if p]


def quote_in_note(quote: str, note: str) -> bool:
    """A verbatim quote after whitespace normalization; pieces joined by '...' must occur in order.
    One pair of quotation marks around the whole quote is not part of it."""
    hay = normalize_ws(note)
    pos = 0
    pieces = split_pieces(quote)
    if not pieces:
        return False
    for p in pieces:
        i = hay.find(p, pos)
        if i < 0:
            return False
        pos = i + len(p)
    return True


def with_atom_enum(schema: dict, names: list[str]) -> dict:
    """The value-miner schema with `atom` restricted to this pass's atoms (xgrammar enforces it)."""
    out = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and "atom" in props and "value" in props:
                props["atom"] = {"type": "string", "enum": list(names)}
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    return out


def compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Check:
    """Outcome of validating one output."""

    problems: list[tuple[str, str]]  # (category, message)
    output: object = None
    output_json: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str | None:
        if not self.problems:
            return None
        return min(
            (c for c, _ in self.problems), key=lambda c: REASONS.index(c) if c in REASONS else len(REASONS)
        )

    @property
    def messages(self) -> list[str]:
        return [m for _, m in self.problems]

    def result(
        self, *, stage: str, teacher: str, model: str, prompt_version: str, messages: list, **more
    ) -> StageResult:
        """The stage result this check makes: accepted with the checked output, or rejected with its
        reason and problems; `more` sets the other fields (item, attempts, usage)."""
        return StageResult(
            stage=stage,
            status="accepted" if self.ok else "rejected",
            reason=self.reason,
            problems=self.messages,
            teacher=teacher,
            model=model,
            prompt_version=prompt_version,
            messages=messages,
            output_json=self.output_json if self.ok else None,
            output=self.output if self.ok else None,
            **more,
        )


def parse_json(
    content: str | None, finish_reason: str | None, max_tokens: int
) -> tuple[object, list[tuple[str, str]]]:
    text = (content or "").strip()
    problems: list[tuple[str, str]] = []
    if finish_reason == "length":
        problems.append(
            (
                "truncated",
                f"the output was cut off at the token limit ({max_tokens}); "
                "return a complete, shorter JSON object",
            )
        )
    if not text:
        return None, problems or [("empty", "the output was empty")]
    if text.startswith("```"):  # models sometimes fence JSON; the content inside is what counts
        text = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", text)
    try:
        return json.loads(text), problems
    except ValueError as e:
        return None, problems or [
            ("json", f"not valid JSON: {getattr(e, 'msg', e)} at character {getattr(e, 'pos', '?')}")
        ]


def parse_output(
    content: str | None, finish_reason: str | None, max_tokens: int, model: type[M]
) -> tuple[M | None, list[tuple[str, str]]]:
    """A stage's output -> its typed model: ``(output, [])``, or ``(None, problems)`` whose categories
    are "empty" / "truncated" / "json" (no usable JSON) or "schema" (JSON that is not the model). The
    first step of every stage's check; what `verdict.core.metrics` calls json_valid / schema_valid."""
    obj, problems = parse_json(content, finish_reason, max_tokens)
    if problems:
        return None, problems
    try:
        return model.model_validate(obj), []
    except ValidationError as e:
        return None, [("schema", p) for p in describe_validation_error(e, "output")]
