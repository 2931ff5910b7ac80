"""What the audit store keeps of a note under `store_notes: false`: hashes and offsets, no text.

A decision's artifacts quote the note (evidence of each value, in the decision, the resolved patient,
the value-miner outputs, the conflicts and the rationale Markdown) and carry the miner's free-text
assessment of it. `note_free` replaces each quote with a reference - the quote's SHA-256 and where it
is in the note as sent (offset, length) - and each assessment with its hash, everywhere in the
artifacts, the Markdown included. The response to the caller is not changed: it has the note anyway.
"""

from __future__ import annotations

import hashlib

from verdict.core.rationale import md

QUOTE_KEYS = frozenset({"evidence", "quote"})  # verbatim quotes of the note
FREE_TEXT_KEYS = frozenset({"note", "assessment"})  # the miner's words about the note


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def quote_ref(quote: str, note: str) -> str:
    """A quote as the store keeps it without the note: hash, offset and length."""
    at = note.find(quote)
    where = f"offset {at}" if at >= 0 else "not found in the note"
    return f"[not kept: {_sha(quote)}, {where}, {len(quote)} chars]"


def note_free(artifacts: dict, note: str) -> dict:
    quotes: dict[str, str] = {}

    def strip(x, key: str | None = None):
        if isinstance(x, dict):
            return {k: strip(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v, key) for v in x]
        if isinstance(x, str) and x:
            if key in QUOTE_KEYS:
                quotes.setdefault(x, quote_ref(x, note))
                return quotes[x]
            if key in FREE_TEXT_KEYS:
                return f"[not kept: {_sha(x)}]"
        return x

    out = strip(artifacts)

    def unquote(text: str) -> str:
        # Free text (the Markdown) cites quotes in double quotes, raw or Markdown-escaped.
        for q in sorted(quotes, key=len, reverse=True):
            for shown in {q, md(q)}:
                text = text.replace(f'"{shown}"', f'"{quotes[q]}"')
        return text

    def rewrite(x, key: str | None = None):
        if isinstance(x, dict):
            return {k: rewrite(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [rewrite(v, key) for v in x]
        if isinstance(x, str) and key not in QUOTE_KEYS and quotes:
            return unquote(x)
        return x

    return rewrite(out)
