"""Several documents per patient through `POST /v1/match` (real service process, real HTTP, the
scripted formalizer): evidence names its document, documents that disagree are a reported conflict
with the atom left open, the clinician page highlights each quote in its own document, and the old
single `note` still works."""

from __future__ import annotations

import pytest
from verdict.serve.model_files import folder_digest
from verdict.serve.protocol import MAX_NOTE_CHARS, MAX_NOTES

from tests.data_gen.teacher_data import ADULTS, age_atom
from tests.fixtures.vllm import STUDENT_MAX_TOKENS
from tests.serve.conftest import start_service

PROGRAM = {
    "atoms": [
        age_atom(),
        {"name": "has_chest_pain", "domain": "bool", "kind": "diagnosis", "definition": "Has chest pain."},
    ],
    "cohorts": [
        {
            "id": "main",
            "inclusion": [ADULTS],
            "exclusion": [{"id": "exc1", "text": "Chest pain", "formula": "has_chest_pain"}],
        }
    ],
}
INC = '"name": "age_years"'
EXC = '"name": "has_chest_pain"'
ADMISSION = "Admission note: 40 years old. Reports chest pain since Monday."
FOLLOW_UP = "Follow-up letter: seen again today. Denies chest pain."
BAD = "Bad letter: the answer quotes text that is not here."


def values(*items) -> dict:
    return {"content": {"values": [{"atom": a, "value": v, "evidence": e} for a, v, e in items]}}


COST_NOTE = "Cost note: nothing of interest."
SCRIPT = {
    "rules": [
        {  # fixed token counts, so the cost a match reports can be checked against what was sent
            "match": {"contains": ["Cost note:"]},
            "responses": [{"auto": "nulls", "prompt_tokens": 1000, "completion_tokens": 37}],
        },
        {
            "match": {"contains": ["Admission note:", INC]},
            "responses": [values(("age_years", 40, "40 years old"))],
        },
        {"match": {"contains": ["Follow-up letter:", INC]}, "responses": [values(("age_years", None, ""))]},
        {
            "match": {"contains": ["Admission note:", EXC]},
            "responses": [values(("has_chest_pain", True, "Reports chest pain"))],
        },
        {
            "match": {"contains": ["Follow-up letter:", EXC]},
            "responses": [values(("has_chest_pain", False, "Denies chest pain"))],
        },
        {
            "match": {"contains": ["Bad letter:", EXC]},
            "responses": [values(("has_chest_pain", True, "not quoted"))],
        },
        {"match": {"contains": ["Patient note"]}, "responses": [{"auto": "nulls"}]},
    ],
    "default": {"auto": "nulls"},
}


def one_document_per_call() -> int:
    """A students' context that holds any one of the test documents beside the prompt, never two
    (counted with the byte estimate: the test config names no tokenizer)."""
    from verdict.core.program import TrialProgram, check_program
    from verdict.data_gen.formalizer import miner_messages, side_atoms
    from verdict.data_gen.formalizer.budget import ByteEstimate

    prog = check_program(TrialProgram(trial_id="T-NOTES", **PROGRAM))
    c = ByteEstimate()
    need = max(
        STUDENT_MAX_TOKENS[f"miner_{side}"]
        + c.count_messages(miner_messages(prog, "", side, side_atoms(prog, side)))
        for side in ("inclusion", "exclusion")
    )
    return need + 8 + max(c.count_text(t) for t in (ADMISSION, FOLLOW_UP, BAD)) + 2


@pytest.fixture(scope="module")
def miner_files(tmp_path_factory):
    """A stand-in adapter folder for the value miner: its content hash is pinned in every record."""
    folder = tmp_path_factory.mktemp("miner-adapter")
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


@pytest.fixture(scope="module")
def svc(tmp_path_factory, scripted, miner_files):
    s = start_service(
        tmp_path_factory.mktemp("notes-service"),
        scripted.url,
        {
            "formalizer": {
                "parser_model": "scripted",
                "value_miner_model": "scripted",
                "context_tokens": one_document_per_call(),
                "model_files": {"scripted": str(miner_files)},
            }
        },
    )
    # a reviewed program: the test is about the value miner, not the parser
    s.upload({"trial_id": "T-NOTES", **PROGRAM})
    yield s
    s.stop()


NOTES = [
    {"id": "adm-1", "text": ADMISSION, "date": "2024-03-01", "kind": "admission"},
    {"id": "fu-2", "text": FOLLOW_UP, "date": "2024-03-09"},
]


def test_documents_that_disagree_are_a_reported_conflict_and_the_atom_stays_open(svc, scripted):
    before = len(scripted.requests)
    with svc.client() as c:
        r = c.post(
            "/v1/match", json={"trial_id": "T-NOTES", "patient": {"patient_id": "P-DOCS", "notes": NOTES}}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(scripted.requests) - before == 4  # two documents x two sides
    res = {x["atom"]: x for x in body["patient"]["resolutions"]}
    assert res["age_years"]["value"] == 40 and res["age_years"]["evidence_source"] == "adm-1"
    chest = res["has_chest_pain"]
    assert chest["status"] == "unresolved" and "extraction conflict" in chest["note"]  # not imputed
    (conflict,) = body["extraction_conflicts"]
    assert conflict["atom"] == "has_chest_pain" and conflict["side"] == "exclusion"
    assert [(f["value"], f["evidence"], f["document"]) for f in conflict["findings"]] == [
        (True, "Reports chest pain", "adm-1"),
        (False, "Denies chest pain", "fu-2"),
    ]
    assert body["decision"]["decision"] != "ineligible"  # the exclusion is open, not applied
    assert "Documents disagree" in body["rationale_markdown"] and "`fu-2`" in body["rationale_markdown"]
    assert body["rationale"]["extraction_conflicts"][0]["atom"] == "has_chest_pain"
    with svc.client("audit") as a:
        rec = a.get(body["links"]["decision"]).json()
        page = a.get(body["links"]["page"])
    art = rec["artifacts"]
    assert [d["id"] for d in art["documents"]] == ["adm-1", "fu-2"] and "text" not in art["documents"][0]
    assert art["extraction_conflicts"][0]["findings"][1]["document"] == "fu-2"
    assert art["value_miner"]["miner_exclusion"]["calls"] == [
        {"item": "adm-1#1/c1", "attempts": 1},
        {"item": "fu-2#1/c1", "attempts": 1},
    ]
    assert rec["note_stored"]
    html = page.text
    assert page.status_code == 200
    # each quote is highlighted in its own document; the conflict is listed with both quotes
    adm = html[html.index('data-document="adm-1"') : html.index('data-document="fu-2"')]
    assert '<mark id="ev-0-0" data-atoms="age_years">40 years old</mark>' in adm
    assert 'href="#ev-0-0">in adm-1</a>' in html
    assert 'id="conflicts"' in html and "Denies chest pain" in html and "admission, 2024-03-01" in html


def test_a_single_note_still_works_and_its_evidence_names_the_note(svc):
    with svc.client() as c:
        r = c.post(
            "/v1/match", json={"trial_id": "T-NOTES", "patient": {"patient_id": "P-ONE", "note": ADMISSION}}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    res = {x["atom"]: x for x in body["patient"]["resolutions"]}
    assert res["has_chest_pain"]["value"] is True and res["has_chest_pain"]["evidence_source"] == "note"
    assert body["extraction_conflicts"] == [] and body["decision"]["decision"] == "ineligible"
    with svc.client("audit") as a:
        rec = a.get(body["links"]["decision"]).json()
        html = a.get(body["links"]["page"]).text
    assert rec["artifacts"]["documents"] is None
    assert '<mark id="ev-0" data-atoms="age_years">40 years old</mark>' in html


@pytest.mark.parametrize(
    "patient, expect",
    [
        (
            {"patient_id": "P", "note": "x", "notes": [{"id": "a", "text": "y"}]},
            "exactly one of `note` and `notes`",
        ),
        ({"patient_id": "P"}, "exactly one of `note` and `notes`"),
        (
            {"patient_id": "P", "notes": [{"id": "a", "text": "y"}, {"id": "a", "text": "z"}]},
            "duplicate document",
        ),
        ({"patient_id": "P", "notes": [{"id": "a", "text": ""}]}, "patient.notes.0.text"),
        ({"patient_id": "P", "notes": [{"id": "a", "text": "y"}, {"id": "b", "text": " \n\t"}]}, "blank"),
        (  # a document over the per-document limit (the body is under the request limit)
            {"patient_id": "P", "notes": [{"id": "a", "text": "y" * (MAX_NOTE_CHARS + 1)}]},
            "patient.notes.0.text",
        ),
        (  # more documents than one request takes: the limit is named
            {"patient_id": "P", "notes": [{"id": f"d{i}", "text": f"Visit {i}."} for i in range(2000)]},
            f"at most {MAX_NOTES} items",
        ),
        ({"patient_id": "P", "notes": [{"id": "a b", "text": "y"}]}, "patient.notes.0.id"),
    ],
)
def test_invalid_notes_are_422(svc, patient, expect):
    with svc.client() as c:
        r = c.post("/v1/match", json={"trial_id": "T-NOTES", "patient": patient})
    assert r.status_code == 422 and expect in r.text, r.text


def test_batch_patients_with_documents_become_notes(tmp_path):
    import json

    from verdict.data_gen.sources import load_patients
    from verdict.serve.batch.match_batch import patient_input

    rows = [
        {"_id": "P1", "documents": NOTES},
        {"_id": "P2", "text": ADMISSION},
        {"_id": "P3", "documents": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]},
    ]
    path = tmp_path / "patients.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_patients(path)
    assert [p.patient_id for p in loaded.items] == ["P1", "P2"]
    assert loaded.problems == [
        "patients.jsonl:3: patient 'P3' has invalid 'documents' "
        "(patient: Value error, document ids must be unique)"
    ]
    many, one = (patient_input(p) for p in loaded.items)
    assert [d.id for d in many.notes] == ["adm-1", "fu-2"] and many.notes[0].date == "2024-03-01"
    assert many.note is None and one.note == ADMISSION and one.notes is None


def test_a_rejected_call_leaves_its_atoms_unresolved_naming_the_call_and_keeps_the_others(svc):
    notes = [NOTES[0], {"id": "bad-3", "text": BAD}]
    with svc.client() as c:
        r = c.post(
            "/v1/match", json={"trial_id": "T-NOTES", "patient": {"patient_id": "P-BAD", "notes": notes}}
        )
    assert r.status_code == 200, r.text
    res = {x["atom"]: x for x in r.json()["patient"]["resolutions"]}
    pain = res["has_chest_pain"]  # asked in the bad letter's call too: that letter may say otherwise
    assert pain["status"] == "unresolved" and "document 'bad-3'" in pain["note"], pain
    assert "failed validation after one repair (evidence)" in pain["note"]
    assert res["age_years"]["status"] == "observed" and res["age_years"]["value"] == 40  # the others stand
    assert "not quoted" not in r.text and "Bad letter" not in r.text  # no model output, no note text


def test_a_side_whose_every_call_is_rejected_is_a_502_naming_the_call(svc):
    with svc.client() as c:
        r = c.post(
            "/v1/match",
            json={
                "trial_id": "T-NOTES",
                "patient": {"patient_id": "P-BAD", "notes": [{"id": "bad-3", "text": BAD}]},
            },
        )
    assert r.status_code == 502 and r.json()["error"] == "formalizer_output_invalid", r.text
    msgs = [p["message"] for p in r.json()["problems"]]
    assert "call bad-3#1/c1 rejected (reason: evidence)" in msgs
    assert "not quoted" not in r.text and "Bad letter" not in r.text  # no model output, no note text


def test_a_match_reports_what_it_sent_and_a_repeat_is_free(svc, scripted, miner_files):
    """Per-pair cost: calls and tokens of the calls sent (both sides), counted by the scripted
    server over HTTP; the same record again reuses the values already mined and costs no model work."""
    patient = {"patient_id": "P-COST", "notes": [{"id": "c-1", "text": COST_NOTE}]}
    costs = []
    for _ in range(2):
        before = len(scripted.requests)
        with svc.client() as c:
            r = c.post("/v1/match", json={"trial_id": "T-NOTES", "patient": patient})
        assert r.status_code == 200, r.text
        costs.append((len(scripted.requests) - before, r.json()["cost"]))
    (sent, first), (sent_again, again) = costs
    assert sent == 2  # one document x two sides
    assert first["mining"] == {"calls": 2, "cache_hits": 0, "prompt_tokens": 2000, "completion_tokens": 74}
    assert first["reading"] is None  # a one-document chart is mined directly
    assert sent_again == 0
    assert again["mining"] == {"calls": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 0}
    assert (first["reused_atoms"], again["reused_atoms"]) == (0, 2)  # this record's values, mined once
    with svc.client("audit") as a:
        rec = a.get(f"/v1/decisions/{r.json()['decision_id']}").json()
        assert rec["artifacts"]["cost"] == again  # the audit record keeps it
        # and pins the weights that answered by content, not by name
        assert rec["models"]["files"] == {"scripted": folder_digest(miner_files)}
        metrics = a.get("/metrics").text
    calls = [x for x in metrics.splitlines() if x.startswith("verdict_pair_model_calls_count")]
    assert calls and float(calls[0].split()[-1]) >= 2
    assert 'verdict_pair_tokens_sum{kind="prompt"}' in metrics


def test_a_5_mb_document_is_413_before_the_service_reads_it(svc):
    big = {"patient_id": "P", "notes": [{"id": "scan", "text": "x" * 5_000_000}]}
    with svc.client() as c:
        r = c.post("/v1/match", json={"trial_id": "T-NOTES", "patient": big})
    assert r.status_code == 413 and "over 4000000 bytes" in r.text, r.text[:300]


def test_a_chart_of_hundreds_of_documents_is_taken_whole(svc, scripted):
    """A hospital chart (300 distinct documents) is accepted and every document is read: none is
    dropped to fit a limit."""
    notes = [{"id": f"doc-{i}", "text": f"Progress note {i}: stable on day {i}."} for i in range(300)]
    with svc.client() as c:
        r = c.post(
            "/v1/match", json={"trial_id": "T-NOTES", "patient": {"patient_id": "P-BIG", "notes": notes}}
        )
    assert r.status_code == 200, r.text[:500]
    sent = [
        m["content"]
        for q in scripted.requests[-r.json()["cost"]["mining"]["calls"] :]
        for m in q.body["messages"]
    ]
    assert all(any(f"Progress note {i}:" in x for x in sent) for i in range(300))


def test_a_long_charts_page_shows_the_documents_with_evidence_and_folds_the_rest(svc):
    """The page of a chart of many documents leads with those the evidence comes from; the others
    are folded under one line, each still there whole (nothing dropped from the page)."""
    notes = [{"id": f"quiet-{i}", "text": f"Progress note {i}: stable on day {i}."} for i in range(12)]
    notes.insert(5, {"id": "adm-1", "text": ADMISSION, "kind": "admission", "date": "2024-03-01"})
    with svc.client() as c:
        r = c.post(
            "/v1/match", json={"trial_id": "T-NOTES", "patient": {"patient_id": "P-FOLD", "notes": notes}}
        )
    assert r.status_code == 200, r.text[:500]
    with svc.client("audit") as a:
        html = a.get(r.json()["links"]["page"]).text
    fold = html.index('id="documents-without-evidence"')
    assert "12 more documents hold no evidence for this decision" in html
    assert html.index('data-document="adm-1"') < fold  # the evidence's document, unfolded
    assert all(html.index(f'data-document="quiet-{i}"') > fold for i in range(12))  # each kept, folded
