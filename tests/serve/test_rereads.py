"""Re-reading a decision's chart (issue 23): `POST /v1/decisions/{id}/rereads` and the review that
completes a staged decision's mining. Real `verdict serve api` processes over real HTTP, the scripted
OpenAI-compatible server playing a reader and a miner that miss nothing they are shown (and counting
every call).

Two services share the scripted server: `staged` mines in stages and keeps the patient text in its
audit store; `exhaustive` mines every atom and keeps only hashes (`store_notes: false`), so a re-read
there must carry the record again.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.data_gen.teacher_data import (
    ADULTS,
    AGE,
    CHART_VALUES,
    COND_1,
    PREG,
    age_atom,
    chart_script,
    long_chart,
)
from tests.serve.conftest import start_service
from tests.support import wait_until

TRIAL = "T-REREAD"
PROGRAM = {
    "trial_id": TRIAL,
    "atoms": [
        age_atom("Age."),
        {"name": "has_condition_1", "domain": "bool", "kind": "diagnosis", "definition": "Has condition 1."},
        {"name": "is_pregnant", "domain": "bool", "kind": "diagnosis", "definition": "Is pregnant."},
    ],
    "cohorts": [
        {
            "id": "main",
            "inclusion": [ADULTS, {"id": "inc2", "text": "Condition 1", "formula": "has_condition_1"}],
            "exclusion": [{"id": "exc1", "text": "Pregnancy", "formula": "is_pregnant"}],
        }
    ],
}
SLOW_MARK = "Seen on ward thirteen."  # a note whose inclusion atoms the scripted miner answers slowly
SLOW = {
    "match": {"contains": [SLOW_MARK, "has_condition_1"]},
    "responses": [
        {
            "auto": "nulls",
            "only_quoted": True,
            "latency_s": 5.0,
            "auto_values": {"age_years": CHART_VALUES["age_years"]},
        }
    ],
}
SCRIPT = chart_script(SLOW)
FORMALIZER = {"parser_model": "scripted", "value_miner_model": "scripted", "context_tokens": 4096}


def note(tag: str, pregnant: bool = True) -> str:
    """A short note (mined whole); `tag` makes it a record of its own (no reuse across tests)."""
    text = f"{AGE} {COND_1}. Clinic visit {tag}."
    return text + (f" Today a {PREG}." if pregnant else "")


def start(folder, url: str, **api):
    from verdict.serve.api_keys import KeyStore

    s = start_service(folder, url, api)
    s.keys["review"] = KeyStore(s.folder / "keys.json").add("test-review", ["review"])[0]
    s.upload(PROGRAM)
    return s


@pytest.fixture(scope="module")
def staged(tmp_path_factory, scripted):
    s = start(
        tmp_path_factory.mktemp("rereads-staged"),
        scripted.url,
        formalizer={**FORMALIZER, "staged_mining": True},
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def exhaustive(tmp_path_factory, scripted):
    s = start(
        tmp_path_factory.mktemp("rereads-hashes"), scripted.url, formalizer=FORMALIZER, store_notes=False
    )
    yield s
    s.stop()


def match(svc, patient: dict) -> dict:
    with svc.client("match") as c:
        r = c.post("/v1/match", json={"trial_id": TRIAL, "patient": patient})
    assert r.status_code == 200, r.text
    return r.json()


def resolutions(body: dict) -> dict[str, dict]:
    return {x["atom"]: x for x in body["patient"]["resolutions"]}


def not_asked(body: dict) -> list[str]:
    return sorted(a for a, x in resolutions(body).items() if (x.get("note") or "").startswith("not asked"))


def outcome(body: dict) -> tuple:
    """What a decision says: its label and each atom's status and value."""
    return body["decision"]["decision"], {
        a: (x["status"], x.get("value")) for a, x in resolutions(body).items()
    }


def test_an_atom_the_read_once_sheet_missed_is_found_by_an_exhaustive_read(staged, scripted):
    notes = [d.model_dump(exclude_none=True) for d in long_chart().documents]
    first = match(staged, {"patient_id": "P-SHEET", "notes": notes})
    assert resolutions(first)["is_pregnant"]["status"] != "observed"  # on the chart, not on the sheet
    assert first["decision"]["decision"] != "ineligible"
    before = len(scripted.requests)
    body = {"atoms": ["is_pregnant"], "reason": "the pregnancy test may be in a note the sheet left out"}
    with staged.client("review") as c:
        r = c.post(f"/v1/decisions/{first['decision_id']}/rereads", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["parent_id"] == first["decision_id"] and out["changed"] and out["chart"] == "store"
    assert out["read"] == ["is_pregnant"] and out["completed"] == []
    preg = resolutions(out["result"])["is_pregnant"]
    assert (preg["status"], preg["value"], preg["evidence_source"]) == ("observed", True, "d10")
    assert out["result"]["decision"]["decision"] == "ineligible"
    # every document was read (not the sheet): calls paid, counted in the cost, no reading
    cost = out["result"]["cost"]
    assert cost["mining"]["calls"] == len(scripted.requests) - before > 1 and cost["reading"] is None
    [change] = out["changes"]
    assert change["type"] == "reread" and change["atom"] == "is_pregnant" and change["value"] is True
    assert change["previous"]["status"] != "observed" and change["details"]["document"] == "d10"
    with staged.client("audit") as a:
        old = a.get(f"/v1/decisions/{first['decision_id']}/history").json()
        rec = a.get(out["links"]["decision"]).json()
        page = a.get(out["links"]["page"]).text
    assert old["superseded"] and old["current_id"] == out["decision_id"]
    assert [e["kind"] for e in a_history(staged, out["decision_id"])] == ["match", "reread"]
    assert rec["artifacts"]["reread"][0]["chart"] == "whole" and rec["artifacts"]["cost"] == cost
    assert rec["artifacts"]["chart_read"] == a_record(staged, first["decision_id"])["artifacts"]["chart_read"]
    assert (
        'data-change="reread"' in page and "re-read in the whole chart" in page and "(document d10)" in page
    )


def a_history(svc, decision_id: str) -> list[dict]:
    with svc.client("audit") as a:
        return a.get(f"/v1/decisions/{decision_id}/history").json()["entries"]


def a_record(svc, decision_id: str) -> dict:
    with svc.client("audit") as a:
        return a.get(f"/v1/decisions/{decision_id}").json()


def test_completing_a_staged_decision_equals_the_exhaustive_decision(staged, exhaustive, scripted):
    patient = {"patient_id": "P-COMPLETE", "note": note("complete")}
    first = match(staged, patient)
    unasked = not_asked(first)
    assert first["decision"]["decision"] == "ineligible" and sorted(unasked) == [
        "age_years",
        "has_condition_1",
    ]
    calls = len(scripted.requests)
    with staged.client("audit") as a:
        page = a.get(first["links"]["page"])
    assert page.status_code == 200 and "not asked" in page.text
    assert len(scripted.requests) == calls  # rendering a page never calls a model
    with staged.client("review") as c:
        r = c.post(
            f"/v1/decisions/{first['decision_id']}/rereads", json={"complete": True, "reason": "audit"}
        )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["completed"] == ["age_years", "has_condition_1"] and out["read"] == []
    assert (
        len(scripted.requests) > calls
        and out["result"]["cost"]["mining"]["calls"] == len(scripted.requests) - calls
    )
    [change] = out["changes"]
    assert change["type"] == "complete" and change["details"]["found"] == ["age_years", "has_condition_1"]
    assert outcome(out["result"]) == outcome(match(exhaustive, patient))
    with staged.client("review") as c:  # nothing left to complete
        again = c.post(
            f"/v1/decisions/{out['decision_id']}/rereads", json={"complete": True, "reason": "again"}
        )
    assert again.status_code == 422 and again.json()["problems"][0]["field"] == "complete", again.text


def test_a_review_that_unsettles_a_staged_decision_completes_its_mining(staged, exhaustive, scripted):
    first = match(staged, {"patient_id": "P-REVIEW", "note": note("review")})
    assert first["decision"]["decision"] == "ineligible"
    flag = {"type": "flag", "criterion": "inc2", "note": "check the condition", "reason": "protocol 5.1"}
    calls = len(scripted.requests)
    with staged.client("review") as c:  # still settled: no model call, the atoms stay not asked
        flagged = c.post(f"/v1/decisions/{first['decision_id']}/reviews", json={"changes": [flag]}).json()
    assert len(scripted.requests) == calls and flagged["result"]["cost"]["mining"]["calls"] == 0
    assert not_asked(flagged["result"]) == ["age_years", "has_condition_1"]
    correct = {
        "type": "correct",
        "atom": "is_pregnant",
        "value": False,
        "reason": "the test was repeated: negative",
    }
    with staged.client("review") as c:
        r = c.post(f"/v1/decisions/{flagged['decision_id']}/reviews", json={"changes": [correct]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["type"] for c in out["changes"]] == ["correct", "complete"]
    res = resolutions(out["result"])
    assert (res["age_years"]["status"], res["age_years"]["value"]) == ("observed", 52)  # read, not a default
    assert res["has_condition_1"]["status"] == "observed" and res["is_pregnant"]["value"] is False
    assert out["result"]["cost"]["mining"]["calls"] == len(scripted.requests) - calls > 0
    # the same as an exhaustive match on the chart where the test is negative
    exhaustive_body = match(exhaustive, {"patient_id": "P-REVIEW", "note": note("review", pregnant=False)})
    assert out["result"]["decision"]["decision"] == exhaustive_body["decision"]["decision"] == "eligible"


def test_a_lower_role_is_refused_before_the_body_and_an_unknown_atom_is_named(staged):
    first = match(staged, {"patient_id": "P-ROLES", "note": note("roles")})
    route = f"/v1/decisions/{first['decision_id']}/rereads"
    for role in ("match", "audit"):
        with staged.client(role) as c:
            r = c.post(route, content=b"{not json")
        assert r.status_code == 403 and r.json()["error"] == "forbidden", r.text
    with staged.client("review") as c:
        r = c.post(route, json={"atoms": ["is_pregnent", "age_years"], "reason": "typo"})
        assert r.status_code == 422, r.text
        [p] = r.json()["problems"]
        assert p["field"] == "atoms.0" and "did you mean 'is_pregnant'" in p["message"]
        assert c.post(route, json={"reason": "nothing asked"}).status_code == 422
        assert (
            c.post("/v1/decisions/dec_none/rereads", json={"complete": True, "reason": "x"}).status_code
            == 404
        )
    assert (
        a_history(staged, first["decision_id"])[-1]["decision_id"] == first["decision_id"]
    )  # nothing stored


def test_a_store_without_text_needs_the_chart_and_refuses_another(exhaustive):
    patient = {"patient_id": "P-HASHES", "note": note("hashes")}
    first = match(exhaustive, patient)
    route = f"/v1/decisions/{first['decision_id']}/rereads"
    ask = {"atoms": ["is_pregnant"], "reason": "confirm the test"}
    with exhaustive.client("review") as c:
        r = c.post(route, json=ask)
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "patient", r.text
        other = {**patient, "note": note("hashes") + " Seen again."}
        r = c.post(route, json={**ask, "patient": other})
        assert r.status_code == 409 and r.json()["error"] == "chart_mismatch", r.text
        assert r.json()["problems"][0]["field"] == "patient" and first["patient"]["patient_id"] == "P-HASHES"
        r = c.post(route, json={**ask, "patient": {**patient, "patient_id": "P-OTHER"}})
        assert r.status_code == 409 and r.json()["problems"][0]["field"] == "patient.patient_id", r.text
        r = c.post(route, json={**ask, "patient": patient})
    assert r.status_code == 200 and r.json()["chart"] == "request", r.text
    stored = json.dumps(a_record(exhaustive, r.json()["decision_id"]))
    assert PREG not in stored and "[not kept: " in stored  # the new quotes hashed, as a match's


def test_without_the_chart_in_the_store_a_review_that_needs_it_is_refused(tmp_path_factory, scripted):
    """Staged and `store_notes: false`: the not-asked marks survive in the store (the service's own
    words), a review that would need the chart is refused with what to do, the re-read with the
    record completes the mining."""
    svc = start(
        tmp_path_factory.mktemp("rereads-staged-hashes"),
        scripted.url,
        formalizer={**FORMALIZER, "staged_mining": True},
        store_notes=False,
    )
    try:
        patient = {"patient_id": "P-NO-TEXT", "note": note("no text")}
        first = match(svc, patient)
        stored = a_record(svc, first["decision_id"])["artifacts"]
        assert not_asked(stored) == ["age_years", "has_condition_1"] and PREG not in json.dumps(stored)
        correct = {"type": "correct", "atom": "is_pregnant", "value": False, "reason": "negative"}
        with svc.client("review") as c:
            r = c.post(f"/v1/decisions/{first['decision_id']}/reviews", json={"changes": [correct]})
            assert r.status_code == 409 and r.json()["error"] == "chart_needed", r.text
            assert "/rereads" in r.json()["message"]
            r = c.post(
                f"/v1/decisions/{first['decision_id']}/rereads",
                json={"complete": True, "reason": "before the review", "patient": patient},
            )
        assert r.status_code == 200 and r.json()["completed"] == ["age_years", "has_condition_1"], r.text
        assert [e["kind"] for e in a_history(svc, r.json()["decision_id"])] == ["match", "reread"]
    finally:
        svc.stop()


def test_a_cancelled_concurrent_reread_leaves_the_store_consistent(staged, scripted):
    from verdict.serve.audit import AuditStore

    first = match(staged, {"patient_id": "P-CANCEL", "note": f"{note('cancel')} {SLOW_MARK}"})
    assert first["decision"]["decision"] == "ineligible"  # staged: the inclusion atoms were not asked
    route = f"/v1/decisions/{first['decision_id']}/rereads"
    seen, answered = len(scripted.requests), rereads_answered(staged)
    cancelled: list[Exception] = []

    def slow_completion():  # held by the scripted miner; the client gives up (cancels) meanwhile
        with httpx.Client(base_url=staged.url, timeout=1.0, trust_env=False,
                          headers={"Authorization": f"Bearer {staged.keys['review']}"}) as c:  # fmt: skip
            try:
                c.post(route, json={"complete": True, "reason": "slow"})
            except httpx.TimeoutException as e:
                cancelled.append(e)

    t = threading.Thread(target=slow_completion)
    t.start()
    wait_until(
        lambda: any(SLOW_MARK in json.dumps(r.body) for r in scripted.requests[seen:]), "the slow call"
    )
    with staged.client("review") as c:
        fast = c.post(route, json={"atoms": ["is_pregnant"], "reason": "fast"})
    t.join()
    assert cancelled and fast.status_code in (200, 409), fast.text
    # the cancelled one ran to its end in the service (refused at the append if the other came first)
    wait_until(
        lambda: sum(rereads_answered(staged).values()) == sum(answered.values()) + 2, "both re-reads answered"
    )
    if fast.status_code == 200:  # the cancelled one came second: refused at its append (409)
        assert rereads_answered(staged).get("409", 0) == answered.get("409", 0) + 1
    store = AuditStore(staged.folder / "audit.sqlite", read_only=True)
    try:
        assert store.verify().ok
        successor = store.successor(first["decision_id"])
        assert successor is not None and store.successor(successor) is None  # one successor, no fork
        if fast.status_code == 200:
            assert successor == fast.json()["decision_id"]
    finally:
        store.close()


def rereads_answered(svc) -> dict[str, int]:
    """Re-read requests the service has answered, by status (the access log's count)."""
    with svc.client("audit") as a:
        metrics = a.get("/metrics").text
    out: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("verdict_requests_total{") and "/rereads" in line:
            status = line.split('status="')[1].split('"')[0]
            out[status] = out.get(status, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out
