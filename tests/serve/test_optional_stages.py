"""The opt-in arbiter and verbalizer stages of the service (serve/optional_stages.py, paper
appendix A.5, A.6), against the project's scripted OpenAI-compatible server (real HTTP) and a real
`verdict serve api` process: one with both stages on, one with the defaults (both off)."""

from __future__ import annotations

import json

import pytest
from verdict.data_gen.formalizer.client import quotes_any

from tests.data_gen.teacher_data import ADULTS
from tests.serve.conftest import start_service

ARBITER = "values it reported contradict definitional"  # the arbiter prompt (arbiter.v1)
VERBALIZER = "you only restate it"  # the verbalizer prompt (verbalizer.v1)
MINER = "You read one patient note"  # both value-miner prompts
# Severe asthma implies asthma (a definition); the miner reports the severe form and denies the
# plain one: an extraction conflict, not a reason to exclude.
FIX = (
    "40 years old. Reports no asthma history. ARB-FIX: severe asthma attack last week, asthma "
    "confirmed by spirometry."
)
GARBAGE = (
    "40 years old. Reports no asthma history. ARB-GARBAGE: severe asthma attack last week, asthma "
    "confirmed by spirometry."
)
MINED = {
    "age_years": {"value": 40, "evidence": "40 years old"},
    "has_asthma": {"value": False, "evidence": "no asthma history"},
    "has_asthma@@severe": {"value": True, "evidence": "severe asthma attack last week"},
}
OVERRIDE = {
    "atom": "has_asthma",
    "value": True,
    "evidence": "asthma confirmed by spirometry",
    "reason": "the severe form implies asthma, and spirometry confirmed it",
}
RATIONALE = "The patient is excluded: the chart documents severe asthma, which the trial excludes."

SCRIPT = {
    "rules": [
        {
            "match": {"contains": [VERBALIZER, "P-FIX"]},
            "responses": [{"content": {"decision": "ineligible", "rationale": RATIONALE}}],
        },
        # claims a decision the core did not make: rejected (the repair gets the same answer)
        {
            "match": {"contains": [VERBALIZER, "P-GARBAGE"]},
            "responses": [{"content": {"decision": "ineligible", "rationale": "Excluded."}}],
        },
        {"match": {"contains": [ARBITER, "ARB-FIX"]}, "responses": [{"content": {"overrides": [OVERRIDE]}}]},
        {"match": {"contains": [ARBITER, "ARB-GARBAGE"]}, "responses": [{"content": "the chart is unclear"}]},
        {
            "match": {"contains": [MINER, "asthma history"]},
            "responses": [{"auto": "nulls", "auto_values": MINED}],
        },
    ],
}


def atom(name: str, domain: str = "bool", definition: str = "") -> dict:
    return {"name": name, "domain": domain, "kind": "diagnosis", "definition": definition or f"{name}."}


PROGRAM = {
    "trial_id": "T-ARB",
    "atoms": [
        atom("age_years", "int", "Age in years."),
        atom("has_asthma", definition="Has asthma."),
        atom("has_asthma@@severe", definition="Has severe asthma."),
    ],
    "definitions": [
        {
            "id": "severe-implies-asthma",
            "kind": "qualifier_implies_stem",
            "formula": {"op": "implies", "if": "has_asthma@@severe", "then": "has_asthma"},
        }
    ],
    "cohorts": [
        {
            "id": "main",
            "inclusion": [ADULTS],
            "exclusion": [{"id": "exc1", "text": "Severe asthma", "formula": "has_asthma@@severe"}],
        }
    ],
}
MODELS = {"parser_model": "scripted", "value_miner_model": "scripted"}


def _service(tmp_path_factory, scripted, name: str, formalizer: dict):
    s = start_service(tmp_path_factory.mktemp(name), scripted.url, {"formalizer": {**MODELS, **formalizer}})
    s.upload(PROGRAM)
    return s


@pytest.fixture(scope="module")
def svc_on(tmp_path_factory, scripted):
    s = _service(tmp_path_factory, scripted, "stages-on", {"arbiter": True, "verbalizer": True})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def svc_off(tmp_path_factory, scripted):
    s = _service(tmp_path_factory, scripted, "stages-off", {})
    yield s
    s.stop()


def match(svc, pid: str, note: str) -> dict:
    with svc.client() as c:
        r = c.post("/v1/match", json={"trial_id": "T-ARB", "patient": {"patient_id": pid, "note": note}})
    assert r.status_code == 200, r.text
    return r.json()


def asked(scripted, marker: str) -> int:
    return sum(1 for r in scripted.requests if marker in json.dumps(r.body))


def test_arbiter_off_is_never_asked_and_the_conflict_stays_set_aside(svc_off, scripted):
    before = asked(scripted, ARBITER), asked(scripted, VERBALIZER)
    body = match(svc_off, "P-FIX", FIX)
    assert (asked(scripted, ARBITER), asked(scripted, VERBALIZER)) == before
    d = body["decision"]
    assert d["decision"] == "eligible" and d["overrides"] == []  # severe asthma set aside, not excluding
    assert [set(c["atoms"]) for c in d["conflicts"]] == [{"has_asthma", "has_asthma@@severe"}]
    assert body["rationale_text"] is None and "arbiter" not in body["rationale"]
    assert "arbiter" not in body["timings_ms"] and "Arbiter" not in body["rationale_markdown"]


def test_arbiter_on_overrides_a_conflicting_pair_and_the_core_decides_again(svc_on, scripted):
    before = asked(scripted, ARBITER)
    body = match(svc_on, "P-FIX", FIX)
    assert asked(scripted, ARBITER) - before == 1  # one call, accepted at once
    d = body["decision"]
    # the override is the engine's: has_asthma true, so severe asthma stands and excludes
    assert d["decision"] == "ineligible"
    assert d["overrides"] == [{"atom": "has_asthma", "value": True, "reason": OVERRIDE["reason"]}]
    applied = body["rationale"]["arbiter"]
    assert applied["status"] == "applied" and applied["overrides"] == [OVERRIDE]
    assert "has_asthma = true" in body["rationale_markdown"] and "arbiter" in body["timings_ms"]
    # the verbalizer restated the core's decision
    assert body["rationale_text"] == RATIONALE and body["rationale"]["verbalizer"]["status"] == "accepted"
    assert "verbalizer" in body["timings_ms"]
    with svc_on.client("audit") as a:
        rec = a.get(body["links"]["decision"]).json()
    assert rec["decision"] == "ineligible" and rec["artifacts"]["arbiter"]["overrides"] == [OVERRIDE]
    assert rec["artifacts"]["verbalizer"]["rationale_text"] == RATIONALE
    assert rec["artifacts"]["decision"]["overrides"] == d["overrides"] and "arbiter" in rec["timings_ms"]


def test_garbage_from_the_arbiter_keeps_the_solver_result_and_a_false_verbalizer_is_dropped(svc_on, scripted):
    before = asked(scripted, ARBITER)
    body = match(svc_on, "P-GARBAGE", GARBAGE)
    assert asked(scripted, ARBITER) - before == 2  # the answer and its one repair, both unusable
    d = body["decision"]
    assert d["decision"] == "eligible" and d["overrides"] == [] and d["conflicts"]  # the solver's result
    arb = body["rationale"]["arbiter"]
    assert (
        arb["status"] == "failed"
        and arb["overrides"] == []
        and "arbiter output failed validation" in arb["problem"]
    )
    assert "no usable answer" in body["rationale_markdown"]
    # the verbalizer said "ineligible" about an eligible decision: rejected, no text
    assert body["rationale_text"] is None
    verb = body["rationale"]["verbalizer"]
    assert verb["status"] == "failed" and "reason: decision" in verb["problem"]


def test_no_note_text_in_the_service_logs(svc_on, svc_off):
    """Last in the module: both notes went through the arbiter and the verbalizer (accepted and rejected)."""
    texts = {
        str(f): f.read_text(errors="replace") for s in (svc_on, svc_off) for f in s.written if f.exists()
    }
    assert "stage=arbiter" in texts[str(svc_on.folder / "service.log")]  # the stages did log
    assert [name for name, text in texts.items() if quotes_any(text, (FIX, GARBAGE), window=16)] == []
