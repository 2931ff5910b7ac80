"""Sound reductions of a patient's chart before it is read: the site's document selection and exact
de-duplication of copied-forward text. Both only remove text that is elsewhere or out of the site's
scope, and every removal is recorded by document id (never silent).

- **Selection** (`DocumentSelection`, off by default): the document types a site reads (`kinds`)
  and a date window (`since`/`until`). A document with no kind, or no date, is kept: the selection
  drops only what it can tell is out of scope.
- **De-duplication**: a paragraph (text between blank lines) that occurs, after whitespace
  normalization, in several documents is kept only in the latest-dated one (a tie, or no dates: the
  later document in the chart), and removed from the others. Short paragraphs (headings such as
  "Plan:") are never removed: they give the text after them its context. A document left with no
  paragraph is dropped, naming the documents that hold its text. A blank document is dropped too.

The reduced documents keep the ids of the originals; their text is the kept paragraphs joined by
blank lines, so a quote verbatim in it is verbatim in the original unless it spans a removed
paragraph (the reader's check locates every excerpt in the original, `locate`).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

from pydantic import Field, model_validator
from verdict.core.configs import StrictModel

from .checks import normalize_ws
from .passages import paragraph_spans
from .protocol import DroppedDocument, NoteDocument, TrimmedDocument

# Paragraphs shorter than this (after normalization) are never de-duplicated: headings and one-word
# lines repeat across documents and carry the context of what follows them.
DEDUP_MIN_CHARS = 40


class DocumentSelection(StrictModel):
    """The documents a site reads (off by default: every document)."""

    kinds: list[str] | None = Field(
        None, description="document types read (e.g. discharge_summary, progress_note); null: every type"
    )
    since: dt.date | None = Field(None, description="documents dated before this day are not read")
    until: dt.date | None = Field(None, description="documents dated after this day are not read")

    @model_validator(mode="after")
    def _window(self):
        if self.since and self.until and self.since > self.until:
            raise ValueError(f"since ({self.since}) is after until ({self.until})")
        return self

    @property
    def active(self) -> bool:
        return self.kinds is not None or self.since is not None or self.until is not None

    def why_dropped(self, doc: NoteDocument) -> str | None:
        """Why the selection drops this document (no text), or None when it is read."""
        if self.kinds is not None and doc.kind is not None and doc.kind not in self.kinds:
            return f"kind '{doc.kind}' is not selected"
        day = document_day(doc)
        if day is not None and self.since is not None and day < self.since:
            return f"dated {day} before the window ({self.since})"
        if day is not None and self.until is not None and day > self.until:
            return f"dated {day} after the window ({self.until})"
        return None


@dataclass
class ReducedChart:
    """The chart as it is read: the kept documents (original ids, reduced text) and the removals."""

    documents: list[NoteDocument]
    originals: dict[str, NoteDocument]
    dropped: list[DroppedDocument] = field(default_factory=list)
    trimmed: list[TrimmedDocument] = field(default_factory=list)


def document_day(doc: NoteDocument) -> dt.date | None:
    """The document's day (its date's first 10 characters, ISO), or None when absent or not a date."""
    if not doc.date:
        return None
    try:
        return dt.date.fromisoformat(doc.date[:10])
    except ValueError:
        return None


def _newer_first(docs: list[NoteDocument]) -> list[int]:
    """Indices of `docs`, the one that keeps a shared paragraph first: latest date, then latest in
    the chart (undated documents count as oldest)."""
    return sorted(range(len(docs)), key=lambda i: (document_day(docs[i]) or dt.date.min, i), reverse=True)


def reduce_chart(docs: list[NoteDocument], selection: DocumentSelection | None = None) -> ReducedChart:
    """Select, then de-duplicate (see the module docstring). The kept documents stay in chart order."""
    originals = {d.id: d for d in docs}
    dropped: list[DroppedDocument] = []
    read: list[NoteDocument] = []
    for d in docs:
        why = selection.why_dropped(d) if selection is not None else None
        if why is not None:
            dropped.append(DroppedDocument(id=d.id, why="selection", detail=why))
        elif not d.text.strip():
            dropped.append(DroppedDocument(id=d.id, why="empty", detail="no text"))
        else:
            read.append(d)
    spans = [paragraph_spans(d.text) for d in read]
    owner: dict[str, int] = {}  # normalized paragraph -> the document that keeps it
    for i in _newer_first(read):
        for s, e in spans[i]:
            key = normalize_ws(read[i].text[s:e])
            if len(key) >= DEDUP_MIN_CHARS:
                owner.setdefault(key, i)
    kept_docs: list[NoteDocument] = []
    trimmed: list[TrimmedDocument] = []
    for i, d in enumerate(read):
        kept, elsewhere = [], []
        for s, e in spans[i]:
            o = owner.get(normalize_ws(d.text[s:e]), i)
            if o == i:
                kept.append(d.text[s:e])
            elif read[o].id not in elsewhere:
                elsewhere.append(read[o].id)
        removed = len(spans[i]) - len(kept)
        if not kept:
            detail = "every paragraph is kept in " + ", ".join(elsewhere) if elsewhere else "no text"
            dropped.append(DroppedDocument(id=d.id, why="duplicate", detail=detail))
            continue
        if removed:
            trimmed.append(TrimmedDocument(id=d.id, paragraphs_removed=removed, kept_in=elsewhere))
            d = d.model_copy(update={"text": "\n\n".join(kept)})
        kept_docs.append(d)
    return ReducedChart(kept_docs, originals, dropped, trimmed)


def locate(quote: str, text: str) -> int | None:
    """The character offset in `text` where `quote` starts, matching as `quote_in_note` does for
    one piece (whitespace runs equal); None when it is not there."""
    span = locate_span(quote, text)
    return None if span is None else span[0]


def locate_span(quote: str, text: str) -> tuple[int, int] | None:
    """(start, end) of the first place `quote` is in `text`, whitespace runs equal; None if absent."""
    words = quote.split()
    if not words:
        return None
    m = re.search(r"\s+".join(re.escape(w) for w in words), text)
    return (m.start(), m.end()) if m else None
