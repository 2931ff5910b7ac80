"""A multi-document FHIR record through `POST /v1/match` with real parts (issue 23): the session's CPU
vLLM with the tiny student, whose value-miner adapter also learned to read this chart (its `reader`
task: tests/fixtures/vllm.py), behind a real `verdict serve api` process over real HTTP.

The record is the demo patient P1 as four DocumentReferences (her note split in two, two documents
that state nothing about her). It is read once for the two demo trials: the second match reuses the
reading (no reader call, nothing paid, the metrics count the reading once), both decisions are the
ones the core makes from P1's recorded values, each value quotes the document it comes from, and
each trial's page says how the chart was read and names those documents.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.vllm import CHART_OF, CHART_PATIENT, CHART_READING
from tests.serve.conftest import start_service
from tests.serve.test_app import core_decision

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

INTAKE, VISIT = "DocumentReference/p1-intake", "DocumentReference/p1-visit"
# trial -> (the documents its evidence comes from, atom -> (value, document))
EXPECTED = {
    "NCT-DM-01": (
        [INTAKE, VISIT],
        {"age_years": (58, INTAKE), "has_type_2_diabetes": (True, INTAKE), "is_pregnant": (False, VISIT)},
    ),
    "NCT-CKD-02": ([VISIT], {"creatinine_mg_dl": (1.4, VISIT), "on_dialysis": (False, VISIT)}),
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory, vllm_server, student_records):
    """The service reads every chart (CHART_READING, as the students were trained); the demo trials'
    recorded programs uploaded (no parser calls: this module is about the reading)."""
    s = start_service(
        tmp_path_factory.mktemp("chart-read-vllm"),
        vllm_server.base_url,
        {"formalizer": {"reading": CHART_READING}},
    )
    s.upload(
        *({**t["parsed"], "trial_id": t["trial_id"], "title": t["title"]} for t in student_records["trials"])
    )
    yield s
    s.stop()


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, name
    return float(m.group(1))


def test_a_fhir_chart_is_read_once_for_two_trials_and_each_page_names_its_evidence_documents(
    svc, student_chart, student_records
):
    p1 = next(p for p in student_records["patients"] if p["patient_id"] == CHART_OF)
    patient = {"patient_id": CHART_PATIENT, "fhir": student_chart.model_dump(mode="json")}
    bodies = {}
    with svc.client() as c:
        for trial_id in EXPECTED:
            r = c.post("/v1/match", json={"trial_id": trial_id, "patient": patient})
            assert r.status_code == 200, r.text
            bodies[trial_id] = r.json()
    first, second = bodies.values()
    # the reading: one reader call, paid by the first pair; the second reuses it and pays none
    assert first["cost"]["reading"]["calls"] == 1 and first["cost"]["reading_reused"] is False
    assert second["cost"]["reading_reused"] is True
    for trial_id, body in bodies.items():
        docs, values = EXPECTED[trial_id]
        _, _, expected, _ = core_decision(student_records, trial_id, p1)
        # the core's decision on P1's recorded values, for this patient (its id and record hash)
        core = {**json.loads(expected.canonical_json()), "patient_id": CHART_PATIENT}
        assert {**body["decision"], "patient_hash": None} == {**core, "patient_hash": None}, trial_id
        res = {x["atom"]: x for x in body["patient"]["resolutions"]}
        assert {a: (res[a]["value"], res[a]["evidence_source"]) for a in values} == values
    with svc.client("audit") as a:
        recs = {t: a.get(b["links"]["decision"]).json() for t, b in bodies.items()}
        pages = {t: a.get(b["links"]["page"]).text for t, b in bodies.items()}
        text = a.get("/metrics").text
    reads = {t: r["artifacts"]["chart_read"] for t, r in recs.items()}
    assert [r["reused"] for r in reads.values()] == [False, True]
    for trial_id, read in reads.items():
        docs, _ = EXPECTED[trial_id]
        # the student read what it was taught: every fact, nothing kept whole, from the two documents
        assert (read["documents"], read["excerpts_kept"], read["kept_whole"]) == (4, 5, [])
        assert read["sheet_documents"] == [INTAKE, VISIT] and read["evidence_documents"] == docs
        assert "read once: 4 documents -&gt; 5 passages kept" in pages[trial_id]
        assert f"evidence from {', '.join(docs)}" in pages[trial_id]
    # the metrics count the reading once: paid by one match, reused by the other
    assert metric(text, 'verdict_chart_readings_total{result="paid"}') == 1
    assert metric(text, 'verdict_chart_readings_total{result="reused"}') == 1
    paid = sum(b["cost"]["mining"]["calls"] for b in bodies.values()) + first["cost"]["reading"]["calls"]
    assert metric(text, "verdict_pair_model_calls_sum") == paid
