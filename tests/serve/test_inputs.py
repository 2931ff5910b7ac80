"""Inputs at the edges of the formula language, through the running service (real process, real
HTTP, the scripted formalizer): numbers beyond the documented range and NaN/Infinity are refused
as validation problems naming the field (422, never a 500); a formula nested deeper than the bound
is refused at upload, and one at the bound is stored and reloads (GET, match); a value miner that
returns 10**400 for an int atom is a named problem of the miner output (502, never a 500)."""

from __future__ import annotations

import json

import pytest
from verdict.core.formula import MAX_DEPTH, MAX_MAGNITUDE

from tests.serve.conftest import start_service

ATOMS = [
    {
        "name": "age_years",
        "domain": "int",
        "kind": "demographic",
        "unit": "years",
        "definition": "Age in years.",
    },
    {"name": "has_chest_pain", "domain": "bool", "kind": "diagnosis", "definition": "Has chest pain."},
]
AGE_INC = '"name": "age_years"'
SCRIPT = {
    "rules": [
        {
            "match": {"contains": ["Huge age note", AGE_INC]},
            "responses": [
                {
                    "content": {
                        "values": [{"atom": "age_years", "value": 10**400, "evidence": "Huge age note"}]
                    }
                }
            ],
        },
        {
            "match": {"contains": ["Adult note", AGE_INC]},
            "responses": [
                {"content": {"values": [{"atom": "age_years", "value": 40, "evidence": "Adult note"}]}}
            ],
        },
    ],
    "default": {"auto": "nulls"},
}


def program(trial_id: str, formula, exclusion=None) -> dict:
    return {
        "trial_id": trial_id,
        "atoms": ATOMS,
        "cohorts": [
            {
                "id": "main",
                "inclusion": [{"id": "inc1", "text": "Adults", "formula": formula}],
                "exclusion": [{"id": "exc1", "text": "Chest pain", "formula": exclusion or "has_chest_pain"}],
            }
        ],
    }


def age_at_least(rhs) -> dict:
    return {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": rhs}


def nested(depth: int) -> dict:
    """A formula exactly ``depth`` operator levels deep."""
    f = age_at_least(18)
    for _ in range(depth - 1):
        f = {"op": "and", "args": [f]}
    return f


@pytest.fixture(scope="module")
def svc(tmp_path_factory, scripted):
    s = start_service(
        tmp_path_factory.mktemp("inputs-service"),
        scripted.url,
        {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"}},
    )
    yield s
    s.stop()


def upload(svc, body_text: str):
    with svc.client("admin") as c:
        return c.post("/v1/trials", content=body_text, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    "rhs_text", [str(10**400), "NaN", "Infinity", "-Infinity", "1e400", "1000000000000001"]
)
def test_numbers_out_of_range_are_422_naming_the_field(svc, rhs_text):
    body = json.dumps({"program": program("T-NUM", age_at_least(0))}).replace(
        '"rhs": 0', f'"rhs": {rhs_text}'
    )
    assert rhs_text in body
    r = upload(svc, body)
    assert r.status_code == 422, r.text
    assert "cmp.rhs" in r.text and ("finite" in r.text or "NaN" in r.text), r.text


def test_numbers_at_the_edge_of_the_range_are_accepted(svc):
    for rhs in (MAX_MAGNITUDE, -MAX_MAGNITUDE, 10**15):
        r = upload(svc, json.dumps({"program": program(f"T-EDGE-{abs(int(rhs))}", age_at_least(rhs))}))
        assert r.status_code == 200, r.text


def test_nesting_at_the_bound_round_trips_and_one_past_it_is_refused(svc):
    r = upload(svc, json.dumps({"program": program("T-DEEP", nested(MAX_DEPTH + 1))}))
    assert r.status_code == 422, r.text
    assert f"nested deeper than {MAX_DEPTH}" in r.text and "inclusion.0.formula" in r.text
    r = upload(svc, json.dumps({"program": program("T-DEEP", nested(MAX_DEPTH))}))
    assert r.status_code == 200, r.text
    with svc.client() as c:
        got = c.get("/v1/trials/T-DEEP")
        assert got.status_code == 200, got.text  # reloaded from the store
        m = c.post(
            "/v1/match", json={"trial_id": "T-DEEP", "patient": {"patient_id": "P1", "note": "Adult note."}}
        )
    assert m.status_code == 200, m.text
    assert m.json()["decision"]["decision"] == "eligible"


def test_a_miner_value_of_10_to_the_400_is_a_named_502(svc):
    r = upload(svc, json.dumps({"program": program("T-HUGE", age_at_least(18))}))
    assert r.status_code == 200, r.text
    with svc.client() as c:
        m = c.post(
            "/v1/match",
            json={"trial_id": "T-HUGE", "patient": {"patient_id": "P2", "note": "Huge age note."}},
        )
    assert m.status_code == 502, m.text  # the miner output is refused (after one repair), not a crash
    body = m.json()
    assert body["error"] == "formalizer_output_invalid" and "reason: type" in body["message"], body
    assert "Huge age note" not in m.text  # note text never in an error
