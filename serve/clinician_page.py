"""The clinician's view of one decision, as a self-contained HTML page (no scripts, no external
resources): the decision, the criteria that decide it first (the rest collapsed), each with its
evidence highlighted in the note, what to confirm at the screening visit, what would change the
decision, the decision's history, and - for a reviewer logged in - plain HTML review forms.

Everything shown is restated from the audit record by the view model (`page_view.py`); the Jinja2
templates in `templates/` lay it out with autoescape on: notes and criteria are data, never markup.
Readable at 1,280 px on the largest reference programs: fixed-layout tables, and identifiers (long
atom names) wrap anywhere and are shown as a detail, never as the headline.
"""

from __future__ import annotations

import base64
import hashlib
import html
from pathlib import Path

import jinja2
from markupsafe import Markup
from verdict.core.program import TrialProgram

from .audit import DecisionRow
from .page_view import (
    ESTABLISHED_TEXT,
    PageViewer,
    decision_page,
    decisive_criteria,
    evidence_spans,
    note_segments,
)

__all__ = [
    "PAGE_CSP",
    "PageViewer",
    "decisive_criteria",
    "evidence_spans",
    "highlighted_note",
    "render_page",
    "render_template",
]

TEMPLATES = Path(__file__).parent / "templates"
_CSS = (TEMPLATES / "page.css").read_text(encoding="utf-8")
# Every page (the clinician page, login, errors) uses this one stylesheet, allowed by its hash; no
# script at all; forms only to this service.
PAGE_CSP = (
    "default-src 'none'; style-src 'sha256-"
    + base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
    + "'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_META_CSP = PAGE_CSP.replace(" frame-ancestors 'none';", "")  # a <meta> CSP cannot carry frame-ancestors


def _escaped(value) -> Markup:
    # Every value goes through the standard library's escape (quotes as &quot; / &#x27;), so a page
    # reads byte for byte as it did before templates; markup the templates made passes as it is.
    return value if isinstance(value, Markup) else Markup(html.escape(str(value)))


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    finalize=_escaped,
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)
_ENV.globals.update(css=Markup(_CSS), meta_csp=_META_CSP, established=ESTABLISHED_TEXT)


def render_template(name: str, title: str, viewer: PageViewer | None = None, **context) -> str:
    """A complete page from `templates/<name>`: the one stylesheet, the CSP meta, the header bar."""
    return _ENV.get_template(name).render(title=title, viewer=viewer, **context)


def highlighted_note(note: str, spans: list[tuple[int, int, list[str]]], prefix: str = "ev-") -> str:
    """The note as HTML, each span a <mark> with its anchor id and atoms."""
    return str(_ENV.get_template("_note.html").module.note_text(note_segments(note, spans, prefix)))


def render_page(
    row: DecisionRow, program: TrialProgram, viewer: PageViewer | None = None, history=None, notice: str = ""
) -> str:
    """The page of one decision. `history` is the decision's `DecisionHistory`
    (verdict.serve.reviews), if any; `notice` a line shown on top (e.g. the review just recorded)."""
    page = decision_page(row, program, viewer, history=history, notice=notice)
    return render_template("decision.html", page.title, page.viewer, page=page)
