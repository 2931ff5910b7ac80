"""A long chart through `POST /v1/match` (real service process, real HTTP, the scripted formalizer
playing a reader that misses nothing it is shown): read once for two trials, the second makes no
reader call, and the decision record and the clinician page say how the chart was read and which
documents the evidence came from (issue 23)."""

from __future__ import annotations

import pytest

from tests.data_gen.teacher_data import (
    ADULTS,
    CHART_VALUES,
    READER_MARK,
    age_atom,
    chart_script,
    long_chart,
)
from tests.serve.conftest import start_service


def program(trial_id: str, condition: str) -> dict:
    return {
        "trial_id": trial_id,
        "atoms": [
            age_atom("Age."),
            {"name": condition, "domain": "bool", "kind": "diagnosis", "definition": "Has condition 1."},
            {"name": "is_pregnant", "domain": "bool", "kind": "diagnosis", "definition": "Is pregnant."},
        ],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [
                    ADULTS,
                    {"id": "inc2", "text": "Condition 1", "formula": condition},
                ],
                "exclusion": [{"id": "exc1", "text": "Pregnancy", "formula": "is_pregnant"}],
            }
        ],
    }


SCRIPT = chart_script(condition_one=CHART_VALUES["has_condition_1"])


@pytest.fixture(scope="module")
def svc(tmp_path_factory, scripted):
    s = start_service(
        tmp_path_factory.mktemp("chart-read"),
        scripted.url,
        {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted", "context_tokens": 4096}},
    )
    s.upload(program("T-READ-A", "has_condition_1"), program("T-READ-B", "condition_one"))
    yield s
    s.stop()


def reader_requests(srv) -> int:
    return sum(READER_MARK in r.body["messages"][0]["content"] for r in srv.requests)


def test_a_long_chart_is_read_once_for_two_trials_and_the_page_names_the_evidence_documents(svc, scripted):
    notes = [d.model_dump(exclude_none=True) for d in long_chart().documents]
    bodies = []
    with svc.client() as c:
        for trial_id in ("T-READ-A", "T-READ-B"):
            r = c.post(
                "/v1/match", json={"trial_id": trial_id, "patient": {"patient_id": "P-LONG", "notes": notes}}
            )
            assert r.status_code == 200, r.text
            bodies.append(r.json())
            if trial_id == "T-READ-A":
                first = reader_requests(scripted)
    assert first >= 2 and reader_requests(scripted) == first  # the second trial made no reader call
    for body in bodies:
        res = {x["atom"]: x for x in body["patient"]["resolutions"]}
        assert res["age_years"]["value"] == 52 and res["age_years"]["evidence_source"] == "d3"
        assert res["is_pregnant"]["status"] != "observed"  # on the chart, not read: never a fact
    with svc.client("audit") as a:
        recs = [a.get(b["links"]["decision"]).json() for b in bodies]
        html = a.get(bodies[1]["links"]["page"]).text
    reads = [r["artifacts"]["chart_read"] for r in recs]
    assert [r["reused"] for r in reads] == [False, True] and reads[0]["calls"] == first
    assert reads[1]["evidence_documents"] == ["d3", "d7"] and reads[1]["trimmed"][0]["id"] == "d2"
    assert "read once: 12 documents -&gt; 2 passages kept" in html
    assert "evidence from d3, d7" in html
    # a review supersedes the decision on the same chart: it keeps how the chart was read (and costs nothing)
    flag = {"type": "flag", "criterion": "inc2", "note": "check the condition", "reason": "protocol 5.1"}
    with svc.client("admin") as c:
        r = c.post(f"/v1/decisions/{bodies[1]['decision_id']}/reviews", json={"changes": [flag]})
        assert r.status_code == 200, r.text
        reviewed = c.get(r.json()["links"]["decision"]).json()
        page = c.get(r.json()["links"]["page"]).text
    assert reviewed["artifacts"]["chart_read"] == reads[1] and reviewed["artifacts"]["cost"] is None
    assert "read once: 12 documents -&gt; 2 passages kept" in page
