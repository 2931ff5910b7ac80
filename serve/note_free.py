"""What the audit store keeps of a note under `store_notes: false`: hashes and offsets, no text.

A decision's artifacts quote the note (evidence of each value, in the decision, the resolved patient,
the value-miner outputs, the conflicts and the rationale Markdown) and carry the miner's free-text
assessment of it. `note_free` replaces each quote with a reference - the quote's keyed hash (HMAC
under the store's secret, see quote_hash.py) and where it is in the note as sent (offset, length) -
and each assessment with its hash, everywhere in the artifacts, the Markdown included. The response
to the caller is not changed: it has the note anyway.
"""

from __future__ import annotations

import re

from verdict.core.rationale import md
from verdict.core.settled import NOT_ASKED

from .quote_hash import QuoteHasher

QUOTE_KEYS = frozenset({"evidence", "quote"})  # verbatim quotes of the note
FREE_TEXT_KEYS = frozenset({"note", "assessment"})  # the miner's words about the note
# The service's own fixed words in a note: no patient text, and read back (a re-derivation keeps
# atoms staged mining left unasked open, and completes their mining: serve/reviews/reading.py).
KEPT_TEXTS = frozenset({NOT_ASKED})
HIDDEN = "[not kept: "  # how every replacement starts
# A replacement made before (a re-derivation's artifacts hold its parent's): kept as it is.
_REPLACED = re.compile(r"\[not kept: [\w.:-]+(, (offset \d+|not found in the note))?(, \d+ chars)?\]")


def quote_ref(quote: str, note: str, hasher: QuoteHasher) -> str:
    """A quote as the store keeps it without the note: keyed hash, offset and length."""
    at = note.find(quote)
    where = f"offset {at}" if at >= 0 else "not found in the note"
    return f"{HIDDEN}{hasher.ref(quote)}, {where}, {len(quote)} chars]"


def hidden(text: str, hasher: QuoteHasher) -> str:
    """Text not from the note (a reviewer's evidence) as the store keeps it: keyed hash and length."""
    return f"{HIDDEN}{hasher.ref(text)}, {len(text)} chars]"


def note_free(artifacts: dict, note: str, hasher: QuoteHasher) -> dict:
    quotes: dict[str, str] = {}

    def strip(x, key: str | None = None):
        if isinstance(x, dict):
            return {k: strip(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v, key) for v in x]
        if isinstance(x, str) and x and x not in KEPT_TEXTS and not _REPLACED.fullmatch(x):
            if key in QUOTE_KEYS:
                quotes.setdefault(x, quote_ref(x, note, hasher))
                return quotes[x]
            if key in FREE_TEXT_KEYS:
                return f"{HIDDEN}{hasher.ref(x)}]"
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
