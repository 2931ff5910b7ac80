"""A patient record as passages that each fit a token budget: never truncated, never spanning two
documents.

A document that fits is one passage, its whole text. A longer one is cut at paragraph boundaries
(blank lines), a paragraph that alone is too long at sentence ends (or line breaks), a sentence
that alone is too long between words, and only a single word longer than the budget by characters.
Passages do not overlap: each is an exact slice of its document, so an evidence quote found in a
passage is found in the document, and the merge has no duplicates to remove.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .protocol import NoteDocument

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n\s*")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Passage:
    """One slice of one document, as one value-miner call reads it."""

    document: str  # the document's id
    index: int  # 1-based, within the document
    total: int  # passages of this document
    start: int  # character offsets in the document text
    end: int
    text: str
    sub: int = 0  # > 0: a piece of passage `index`, split again to fit (1-based)

    @property
    def id(self) -> str:
        return f"{self.document}#{self.index}" + (f".{self.sub}" if self.sub else "")

    @property
    def label(self) -> str:
        """How problems name it: the document, and the passage when the document has several."""
        return f"document '{self.document}'" + (
            f" passage {self.index}/{self.total}" if self.total > 1 else ""
        )


def _pieces(text: str, start: int, end: int, sep: re.Pattern) -> list[tuple[int, int]]:
    """(start, end) spans of text[start:end] between separator matches, separators left out."""
    out, pos = [], start
    for m in sep.finditer(text, start, end):
        if m.start() > pos:
            out.append((pos, m.start()))
        pos = m.end()
    if end > pos:
        out.append((pos, end))
    return out


def _units(
    text: str, start: int, end: int, fits: Callable[[int, int], bool], level: int = 0
) -> list[tuple[int, int]]:
    """Spans of text[start:end], each fitting on its own: paragraphs, then sentences, then words,
    then characters."""
    if fits(start, end):
        return [(start, end)]
    if level < 3:
        sep = (_PARAGRAPH_BREAK, _SENTENCE_END, _SPACE)[level]
        parts = _pieces(text, start, end, sep)
        if len(parts) > 1:
            return [u for s, e in parts for u in _units(text, s, e, fits, level + 1)]
        return _units(text, start, end, fits, level + 1)
    # one "word" longer than the budget: the longest prefixes that fit (at least one character)
    out, pos = [], start
    while pos < end:
        lo, hi = pos + 1, end
        while lo < hi:  # binary search for the longest fitting prefix
            mid = (lo + hi + 1) // 2
            if fits(pos, mid):
                lo = mid
            else:
                hi = mid - 1
        out.append((pos, lo))
        pos = lo
    return out


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each paragraph of `text` (the text between blank lines), in order."""
    return _pieces(text, 0, len(text), _PARAGRAPH_BREAK)


def split_document(doc: NoteDocument, budget: int | None, count_text: Callable[[str], int]) -> list[Passage]:
    """The document as passages of at most `budget` tokens (None: no limit, the whole text)."""
    text = doc.text
    if budget is None or count_text(text) <= budget:
        return [Passage(doc.id, 1, 1, 0, len(text), text)]

    def fits(s: int, e: int) -> bool:
        return count_text(text[s:e]) <= budget

    units = _units(text, 0, len(text), fits)
    spans = _pack(text, units, budget, count_text, exact=False)
    if not all(fits(s, e) for s, e in spans):  # the sum of the parts was optimistic: pack exactly
        spans = _pack(text, units, budget, count_text, exact=True)
    return [Passage(doc.id, i, len(spans), s, e, text[s:e]) for i, (s, e) in enumerate(spans, 1)]


def _pack(
    text: str, units: list[tuple[int, int]], budget: int, count_text: Callable[[str], int], *, exact: bool
) -> list[tuple[int, int]]:
    """Greedy packing: a passage runs from its first unit's start to its last unit's end. Not
    `exact`: a passage's tokens are taken as the sum of its units' and gaps' (one count per unit)."""
    spans: list[tuple[int, int]] = []
    used = 0
    for s, e in units:
        if spans:
            start, end = spans[-1]
            if exact:
                grown = count_text(text[start:e])
            else:
                grown = used + count_text(text[end:s]) + count_text(text[s:e])
            if grown <= budget:
                spans[-1], used = (start, e), grown
                continue
        spans.append((s, e))
        used = count_text(text[s:e])
    return spans


def split_documents(
    docs: list[NoteDocument], budget: int | None, count_text: Callable[[str], int]
) -> list[Passage]:
    """Every document's passages, documents in the given order."""
    return [p for d in docs for p in split_document(d, budget, count_text)]
