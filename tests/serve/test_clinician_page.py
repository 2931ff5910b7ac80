"""The clinician page rendered without a browser: evidence highlighting, escaping, the deciding
criteria first, the review forms and their CSRF field, no script (the page in a real browser, with
login and review forms: test_clinician_browser.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html import escape
from html.parser import HTMLParser

import pytest
from verdict.core.cases import load_case
from verdict.core.engine import Engine
from verdict.core.policy import load_policy
from verdict.serve.audit import DecisionRow
from verdict.serve.clinician_page import (
    _CSS,
    PAGE_CSP,
    PageViewer,
    decisive_criteria,
    evidence_spans,
    highlighted_note,
    render_page,
)

from tests.support import REFERENCE_V6, REPO, SHARED_DATA, need


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


# ---- the whole page, rendered without a browser (the browser test: test_clinician_browser.py) ------
LARGEST = "sigir-20154/NCT01458405a"  # the reference program with the most criteria (67)


def decision_row(program, patient, decision, note: str | None) -> DecisionRow:
    return DecisionRow(
        decision_id="dec_test",
        created_at=0.0,
        created_by="k",
        trial_id=program.trial_id,
        program_hash=program.content_hash or "",
        patient_id=patient.patient_id,
        note_hash="",
        patient_hash="",
        policy_name="prescreen",
        policy_version="1",
        engine_version="1",
        decision=decision.decision,
        models={},
        timings={},
        note_text=note,
        artifacts={
            "decision": json.loads(decision.canonical_json()),
            "patient": patient.model_dump(mode="json"),
        },
    )


def demo_case(name: str = "01_t2d_eligible.json"):
    case = load_case(REPO / "examples" / "cases" / name)
    patient = case.patient_under(load_policy("prescreen"))
    return case.program, patient, Engine(timeout_ms=5000).decide(case.program, patient), case.note


def reference_case(stem: str = LARGEST):
    need(REFERENCE_V6.exists(), f"shared reference corpus missing: {REFERENCE_V6}")
    from verdict.core.reference import load_reference

    pid, trial = stem.split("/")
    case = load_reference(REFERENCE_V6 / pid / f"{trial}__full.json")
    notes = SHARED_DATA / "benchmarks" / "patients_sigir.jsonl"
    note = next(json.loads(x)["text"] for x in notes.read_text().splitlines() if json.loads(x)["_id"] == pid)
    return case.program, case.patient, Engine(timeout_ms=10000).decide(case.program, case.patient), note


class Forms(HTMLParser):
    """The page's forms with their fields, and the criteria rows in the order they appear."""

    def __init__(self):
        super().__init__()
        self.forms: list[dict] = []
        self.rows: list[tuple[str, str]] = []  # (table id, criterion)
        self.scripts = 0
        self._table = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append({"attrs": a, "fields": {}})
        elif tag in ("input", "select", "textarea") and self.forms and a.get("name"):
            self.forms[-1]["fields"][a["name"]] = a.get("value")
        elif tag == "table":
            self._table = a.get("id", "")
        elif tag == "tr" and "data-criterion" in a:
            self.rows.append((self._table, a["data-criterion"]))
        elif tag == "script":
            self.scripts += 1


def parse(html: str, parser=None):
    """`html` fed to a parser (the forms one by default), which is returned."""
    p = parser if parser is not None else Forms()
    p.feed(html)
    return p


def test_an_ineligible_decision_shows_the_violated_criteria_first_and_folds_the_rest():
    program, patient, decision, note = reference_case()
    assert decision.decision == "ineligible"
    violated = [lb.criterion for lb in decision.labels if lb.label == "violated"]
    html = render_page(decision_row(program, patient, decision, note), program)
    rows = parse(html).rows
    assert len(rows) == len(decision.labels) == 67
    first = [c for t, c in rows if t == "decisive"]
    assert first == violated and rows[: len(first)] == [("decisive", c) for c in violated]
    assert {c for t, c in rows if t == "other"} == {lb.criterion for lb in decision.labels} - set(violated)
    # the rest is collapsed: a <details> without `open`
    n = 67 - len(violated)
    assert f'<details class="other" id="other-criteria"><summary>The other {n} criteria</summary>' in html


def test_an_eligible_decision_shows_the_criteria_resting_on_assumptions_first():
    program, patient, decision, note = demo_case()
    assert decision.decision == "eligible"
    imputed = {r.atom for r in patient.resolutions if r.status == "imputed"}
    resting = {lb.criterion for lb in decision.labels if set(lb.facts) & imputed or lb.label == "deferred"}
    assert resting, "the demo case rests on assumptions"
    assert {c for _, c in decisive_criteria(decision, patient)} == resting
    rows = parse(render_page(decision_row(program, patient, decision, note), program)).rows
    in_order = [lb.criterion for lb in decision.labels if lb.criterion in resting]
    assert [c for t, c in rows[: len(resting)]] == in_order
    assert all(t == "decisive" for t, _ in rows[: len(resting)])
    assert all(t == "other" for t, _ in rows[len(resting) :])


def test_everything_from_the_record_is_escaped():
    program, patient, decision, note = demo_case()
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'"
    program = program.model_copy(update={"title": evil})
    crit = program.cohorts[0].inclusion[0].model_copy(update={"text": evil})
    cohort = program.cohorts[0].model_copy(update={"inclusion": [crit, *program.cohorts[0].inclusion[1:]]})
    program = program.model_copy(update={"cohorts": [cohort]})
    atoms = [a.model_copy(update={"definition": evil}) if a.name == "has_t2dm" else a for a in program.atoms]
    program = program.model_copy(update={"atoms": atoms})
    row = decision_row(program, patient, decision, note + " " + evil)
    html = render_page(row, program, PageViewer(csrf='tok"><script>', can_review=True, who=evil, logout=True))
    assert "<script" not in html and "<img" not in html and parse(html).scripts == 0
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # title, criterion, definition, note
    assert 'value="tok&quot;&gt;&lt;script&gt;"' in html


def test_every_review_form_carries_the_sessions_csrf_token():
    program, patient, decision, note = reference_case()
    row = decision_row(program, patient, decision, note)
    html = render_page(row, program, PageViewer(csrf="TOKEN-1", can_review=True, who="dr", logout=True))
    forms = parse(html).forms
    kinds = [f["attrs"].get("data-review") for f in forms]
    observed = {r.atom for r in patient.resolutions if r.status == "observed"}
    shown = {e for lb in decision.labels for e in lb.facts if e in observed}
    assert kinds.count("correct") == sum(len(set(lb.facts) & observed) for lb in decision.labels) and shown
    assert kinds.count("flag") == 67 and kinds.count("confirm") >= 1
    assert forms[0]["attrs"]["action"] == "/logout"
    for f in forms:
        assert f["attrs"]["method"] == "post" and f["fields"]["csrf"] == "TOKEN-1", f["attrs"]
        if f["attrs"].get("data-review"):
            assert f["attrs"]["action"] == "/v1/decisions/dec_test/page/review"
            assert f["fields"]["type"] == f["attrs"]["data-review"]
    # a reader without the review role (or without a session) gets no forms, and is told why
    for viewer in (PageViewer(csrf="TOKEN-1", can_review=False, who="a"), PageViewer(can_review=True), None):
        html = render_page(row, program, viewer)
        assert not [f for f in parse(html).forms if f["attrs"].get("data-review")]
        assert 'id="no-forms"' in html


@pytest.mark.parametrize("stem", [LARGEST, "sigir-20149/NCT00132327a"])  # most criteria; longest atom name
def test_the_page_has_no_script_and_its_one_style_matches_the_csp_hash(stem):
    program, patient, decision, note = reference_case(stem)
    html = render_page(decision_row(program, patient, decision, note), program)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert styles == [_CSS]
    digest = base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in PAGE_CSP and "script-src" not in PAGE_CSP
    assert "form-action 'self'" in PAGE_CSP and "default-src 'none'" in PAGE_CSP
    assert parse(html).scripts == 0 and " style=" not in html and "javascript:" not in html


class Attrs(HTMLParser):
    """Every attribute of every tag, as a browser's parser reads it back."""

    def __init__(self):
        super().__init__()
        self.attrs: list[tuple[str, str, str | None]] = []  # (tag, name, value)
        self.quotes: list[str] = []
        self._in_q = False

    def handle_starttag(self, tag, attrs):
        self.attrs += [(tag, k, v) for k, v in attrs]
        self._in_q = self._in_q or tag == "q"

    def handle_endtag(self, tag):
        self._in_q = self._in_q and tag != "q"

    def handle_data(self, data):
        if self._in_q:
            self.quotes.append(data)


def attrs_of(html: str) -> Attrs:
    return parse(html, Attrs())


def test_an_evidence_quote_with_a_script_tag_renders_as_text():
    program, patient, decision, note = demo_case()
    quote = "<script>alert(1)</script> HbA1c 7.9%"
    atom = next(r.atom for r in patient.resolutions if r.status == "observed" and r.evidence)
    resolutions = [
        r.model_copy(update={"evidence": quote}) if r.atom == atom else r for r in patient.resolutions
    ]
    patient = patient.model_copy(update={"resolutions": resolutions})
    html = render_page(decision_row(program, patient, decision, note + " " + quote), program)
    assert "<script" not in html and parse(html).scripts == 0
    assert f'<q class="evidence">{escape(quote)}</q>' in html  # the quote, as text
    assert f'data-atoms="{atom}">{escape(quote)}</mark>' in html  # and highlighted in the note
    assert quote in attrs_of(html).quotes


def test_names_with_quotes_and_angle_brackets_stay_inside_their_attributes():
    program, patient, decision, note = demo_case()
    evil = 'x" onmouseover="alert(1)" data-x=\'<b>'
    docs = [{"id": evil, "text": note}, {"id": "second", "text": "nothing here"}]
    row = decision_row(program, patient, decision, json.dumps(docs))
    row.artifacts["documents"] = [{"id": evil, "kind": evil}, {"id": "second"}]
    finding = {"evidence": "q", "document": evil, "passage": "p"}
    row.artifacts["extraction_conflicts"] = [
        {
            "atom": evil,
            "side": "inclusion",
            "findings": [{**finding, "value": True}, {**finding, "value": False}],
        }
    ]
    viewer = PageViewer(csrf=evil, can_review=True, who=evil, logout=True)
    got = attrs_of(render_page(row, program, viewer))
    assert not [a for a in got.attrs if a[1].startswith("on") or a[1] == "data-x"]
    assert ("div", "data-document", evil) in got.attrs  # the document's id (a note's name), whole
    assert ("li", "data-atom", evil) in got.attrs  # the disagreeing atom's name, whole
    assert ("input", "value", evil) in got.attrs  # the session's CSRF token, whole
