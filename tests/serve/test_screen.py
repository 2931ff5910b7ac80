"""`POST /v1/screen`: one patient against the registered trials, or one trial against patients,
ranked by formal distance (verdict_core.ranking) over the real API, with the scripted formalizer
(real HTTP) answering the value miner."""

from __future__ import annotations

import json

import pytest

from data_gen.scripted_server import Script, ScriptedServer
from tests.serve.conftest import start_service

AGE = {"name": "age_years", "domain": "int", "kind": "demographic", "unit": "years", "definition": "Age in years."}


def _bool(name):
    return {"name": name, "domain": "bool", "kind": "diagnosis", "definition": f"The patient has {name}."}


def _program(trial_id, min_age, *exclusions):
    return {"trial_id": trial_id, "atoms": [AGE, *[_bool(e) for e in exclusions]],
            "cohorts": [{"id": "main",
                         "inclusion": [{"id": "inc1", "text": f"age >= {min_age}",
                                        "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": min_age}}],
                         "exclusion": [{"id": f"exc{i}", "text": e, "formula": e} for i, e in enumerate(exclusions)]}]}


TRIALS = [
    _program("T-MISS2", 50, "is_smoker"),  # 40-year-old smoker: two changes from eligible
    _program("T-ELIGIBLE", 18, "has_chest_pain"),  # nothing open
    _program("T-MISS1", 50, "has_chest_pain"),  # one change: age
    _program("T-CONFIRM", 18, "on_dialysis"),  # dialysis not in the note: an assumption to confirm
    _program("T-FAIL", 18, "broken_miner"),  # the miner answers no JSON for this trial (502 after a repair)
]
NOTE_40 = "A man, 40 years old, denies chest pain, current smoker."
NOTE_60 = "A woman, 60 years old, denies chest pain, never smoked."
VALUES = {"age_years": {"value": 40, "evidence": "40 years old"},
          "has_chest_pain": {"value": False, "evidence": "denies chest pain"},
          "is_smoker": {"value": True, "evidence": "current smoker"}}
VALUES_60 = {"age_years": {"value": 60, "evidence": "60 years old"},
             "has_chest_pain": {"value": False, "evidence": "denies chest pain"},
             "is_smoker": {"value": False, "evidence": "never smoked"}}
SCRIPT = {"rules": [
    {"match": {"contains": ['"broken_miner"']}, "responses": [{"fault": "malformed_content"}]},
    {"match": {"contains": ["60 years old"]}, "responses": [{"auto": "nulls", "auto_values": VALUES_60}]},
], "default": {"auto": "nulls", "auto_values": VALUES}}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    svc = start_service(tmp_path_factory.mktemp("screen"), srv.url,
                        {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"}})
    try:
        with svc.client("admin") as admin:
            for t in TRIALS:
                r = admin.post("/v1/trials", json={"program": t})
                assert r.status_code == 200, r.text
        yield svc, srv
    finally:
        svc.stop()
        srv.stop()


def asked(srv, note: str) -> list[str]:
    """The atoms every value-miner call about this note asked for."""
    from data_gen.scripted_server import _find_atom_enum

    return [a for r in srv.requests if note in json.dumps(r.body)
            for a in _find_atom_enum(r.body.get("structured_outputs") or r.body.get("response_format") or {}) or []]


def test_one_patient_against_every_registered_trial_ranked_with_reasons(service):
    svc, srv = service
    with svc.client("match") as c, svc.client("audit") as a:
        r = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}})
        assert r.status_code == 200, r.text
        body = r.json()
        # the five trials declare age_years alike: its value is mined once for this note, not five times
        assert asked(srv, NOTE_40).count("age_years") == 1
        assert sorted(set(asked(srv, NOTE_40))) == ["age_years", "broken_miner", "has_chest_pain", "is_smoker",
                                                    "on_dialysis"]
        assert body["direction"] == "patient" and body["pairs"] == 5
        assert [x["trial_id"] for x in body["rows"]] == ["T-ELIGIBLE", "T-CONFIRM", "T-MISS1", "T-MISS2"]
        eligible, confirm, miss1, miss2 = body["rows"]
        assert (eligible["tier"], eligible["reason"]) == ("eligible", "eligible, nothing to confirm")
        assert confirm["tier"] == "eligible_to_confirm" and confirm["to_confirm"] == ["on_dialysis"]
        assert (miss1["tier"], miss1["distance"]) == ("near_miss", 1)
        assert miss1["would_be_eligible_if"][0].startswith("age_years: 40 -> ")
        assert (miss2["tier"], miss2["distance"]) == ("near_miss", 2)
        assert [x["rank"] for x in body["rows"]] == [1, 2, 3, 4]
        assert body["tiers"] == {"eligible": 1, "eligible_to_confirm": 1, "near_miss": 2}
        # the failing pair has its own error; everything else was decided and recorded
        assert [(f["trial_id"], f["status"]) for f in body["failures"]] == [("T-FAIL", 502)]
        for row in body["rows"]:
            rec = a.get(row["links"]["decision"])
            assert rec.status_code == 200 and rec.json()["decision"] == row["decision"]
            assert a.get(row["links"]["page"]).status_code == 200
        # the same screen again: the same order (a pure function of the decisions)
        again = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}}).json()
        assert [f["trial_id"] for f in again["failures"]] == ["T-FAIL"], again["failures"]
        assert [(x["trial_id"], x["tier"], x["distance"]) for x in again["rows"]] == \
            [(x["trial_id"], x["tier"], x["distance"]) for x in body["rows"]]


def test_one_trial_against_patients_and_a_filter(service):
    svc, _ = service
    with svc.client("match") as c:
        r = c.post("/v1/screen", json={"trial_id": "T-MISS1", "patients": [
            {"patient_id": "P40", "note": NOTE_40}, {"patient_id": "P60", "note": NOTE_60}]})
        assert r.status_code == 200, r.text
        assert [(x["patient_id"], x["tier"]) for x in r.json()["rows"]] == [("P60", "eligible"), ("P40", "near_miss")]
        r = c.post("/v1/screen", json={"patient": {"patient_id": "P60", "note": NOTE_60},
                                       "trial_ids": ["T-MISS2", "T-ELIGIBLE"]})
        assert [x["trial_id"] for x in r.json()["rows"]] == ["T-ELIGIBLE", "T-MISS2"]  # both eligible: by id


@pytest.mark.parametrize("body, field", [
    ({"patient": {"patient_id": "P", "note": "x"}, "trial_id": "T-MISS1"}, "body"),
    ({"trial_id": "T-MISS1"}, "body"),
    ({"patient": {"patient_id": "P", "note": "x"}, "trial_ids": ["NO-SUCH-TRIAL"]}, "trial_ids.0"),
    ({"patient": {"patient_id": "P", "note": "x"}, "trial_ids": []}, "trial_ids"),
])
def test_bad_requests_name_the_problem(service, body, field):
    svc, _ = service
    with svc.client("match") as c:
        r = c.post("/v1/screen", json=body)
        assert r.status_code == 422, r.text
        assert field in {p["field"] for p in r.json()["problems"]}


def test_a_lower_role_cannot_screen(service):
    svc, srv = service
    n = len(srv.requests)
    with svc.client("audit") as a:
        r = a.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}})
        assert r.status_code == 403 and "match" in r.json()["message"]
    assert len(srv.requests) == n  # nothing reached the formalizer


def _cli(args, env_extra=None, tmp=None):
    import os
    import subprocess

    from tests.serve.conftest import verdict_command

    env = {k: v for k, v in os.environ.items() if k not in ("VERDICT_API_KEY", "VERDICT_EGRESS_ALLOW")}
    env.update(env_extra or {})
    return subprocess.run([*verdict_command(), "screen", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_cli_prints_the_ranked_screen_and_writes_it(service, tmp_path):
    svc, _ = service
    note = tmp_path / "note.txt"
    note.write_text(NOTE_40)
    out = tmp_path / "screen.json"
    r = _cli(["--url", svc.url, "--patient-id", "P40", "--note", str(note), "--out", str(out)],
             {"VERDICT_API_KEY": svc.keys["match"]})
    assert r.returncode == 0, r.stderr
    ranked = [line.split()[1] for line in r.stdout.splitlines()[1:-1] if line.split()[0].isdigit()]
    assert ranked == ["T-ELIGIBLE", "T-CONFIRM", "T-MISS1", "T-MISS2"]
    assert "would be eligible if: age_years: 40 -> " in r.stdout and "failed 502" in r.stdout
    assert [x["trial_id"] for x in __import__("json").loads(out.read_text())["rows"]][0] == "T-ELIGIBLE"
    assert NOTE_40 not in r.stdout + r.stderr


def test_the_cli_refuses_a_host_off_the_allowlist_before_sending_anything(service, tmp_path):
    svc, srv = service
    note = tmp_path / "note.txt"
    note.write_text(NOTE_40)
    r = _cli(["--url", "http://10.255.255.1:9", "--patient-id", "P40", "--note", str(note)],
             {"VERDICT_API_KEY": svc.keys["match"]})
    assert r.returncode == 2 and "not allowed" in r.stderr and "Nothing was sent" in r.stderr
    r = _cli(["--url", svc.url, "--patient-id", "P40", "--note", str(note)])
    assert r.returncode == 2 and "$VERDICT_API_KEY is not set" in r.stderr
    r = _cli(["--url", svc.url, "--patient-id", "P40", "--note", str(note)], {"VERDICT_API_KEY": svc.keys["audit"]})
    assert r.returncode == 2 and "HTTP 403" in r.stderr


def test_the_cli_screens_a_trial_against_a_patients_file_and_names_a_bad_line(service, tmp_path):
    svc, _ = service
    pats = tmp_path / "patients.jsonl"
    pats.write_text(json.dumps({"_id": "P40", "text": NOTE_40}) + "\nnot json\n"
                    + json.dumps({"_id": "P60", "text": NOTE_60}) + "\n")
    r = _cli(["--url", svc.url, "--trial", "T-MISS1", "--patients", str(pats)], {"VERDICT_API_KEY": svc.keys["match"]})
    assert r.returncode == 0, r.stderr
    ranked = [line.split()[2] for line in r.stdout.splitlines()[1:-1] if line.split()[0].isdigit()]
    assert ranked == ["P60", "P40"] and "patients.jsonl:2" in r.stderr and "not json" not in r.stderr
