"""Evidence highlighting and escaping of the clinician page (the page itself is checked in a real
browser in test_app.py)."""

from __future__ import annotations

from serve.clinician_page import evidence_spans, highlighted_note


def test_quotes_are_found_across_whitespace_and_ellipses():
    note = "A 58-year-old\n  woman with type 2 diabetes. Creatinine 1.4 mg/dL."
    spans = evidence_spans(note, {"age": "58-year-old woman", "cr": "Creatinine ... mg/dL", "x": "not there"})
    texts = [(note[s:e], atoms) for s, e, atoms in spans]
    assert texts == [("58-year-old\n  woman", ["age"]), ("Creatinine", ["cr"]), ("mg/dL", ["cr"])]


def test_overlapping_quotes_merge_into_one_mark():
    note = "Type 2 diabetes on metformin."
    spans = evidence_spans(note, {"dm": "Type 2 diabetes", "t2": "2 diabetes on metformin"})
    assert spans == [(0, len("Type 2 diabetes on metformin"), ["dm", "t2"])]


def test_note_text_is_escaped_never_markup():
    note = "<script>alert(1)</script> denies <b>chest pain</b> & fever"
    html = highlighted_note(note, evidence_spans(note, {"cp": "<b>chest pain</b>"}))
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<mark id="ev-0" data-atoms="cp">&lt;b&gt;chest pain&lt;/b&gt;</mark>' in html
    assert html.endswith(" &amp; fever")
