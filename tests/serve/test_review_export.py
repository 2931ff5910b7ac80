"""Reviews become site training data (issue 12): `verdict serve export-reviews AUDIT_DB` (its old
spelling `verdict teacher export --from-reviews AUDIT_DB` still runs it and says it moved).

Decisions and reviews come from a real `verdict serve api` process in front of the scripted
formalizer server; the export reads its audit store. `tests/train/test_site_finetune.py` closes the
loop with the tiny student: fine-tuned from its adapter with the review records weighted in, it then
gives the reviewer's value.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer

from tests.serve.conftest import start_service, verdict_command
from tests.serve.test_reviews import CONFIG, program
from tests.support import REPO

TRIAL = "T-REVIEW"
NOTE = "Patient is 45 years old. Creatinine 3.1 mg/dL last year; creatinine 1.3 mg/dL today."
NOTE_2 = "Patient is 45 years old. Creatinine 3.1 mg/dL on admission."
SCRIPT = {
    "rules": [{
        "match": {"contains": ["Creatinine 3.1"]},
        "responses": [{"auto": "nulls", "auto_values": {
            "age_years": {"value": 45, "evidence": "45 years old"},
            "creatinine": {"value": 3.1, "evidence": "Creatinine 3.1 mg/dL"}}}],
    }],
    "default": {"auto": "nulls"},
}  # fmt: skip
CORRECT = {
    "type": "correct",
    "atom": "creatinine",
    "value": "1.3 mg/dL",
    "reason": "3.1 was last year's",
    "evidence": "creatinine 1.3 mg/dL today",
}
NOT_IN_NOTE = {**CORRECT, "evidence": "lab of 2026-11-30: 1.3 mg/dL"}


@pytest.fixture(scope="module")
def scripted():
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    yield srv
    srv.stop()


def service(folder, scripted, **api):
    from verdict.serve.api_keys import KeyStore

    s = start_service(folder, scripted.url, {**CONFIG, **api})
    store = KeyStore(s.folder / "keys.json")
    for role in ("review", "trial_owner"):
        s.keys[role] = store.add(f"test-{role}", [role])[0]
    with s.client("admin") as admin:
        assert admin.post("/v1/trials", json={"program": program()}).status_code == 200
    return s


def match_and_review(svc, patient_id, note, change) -> tuple[str, str]:
    with svc.client("match") as c:
        r = c.post("/v1/match", json={"trial_id": TRIAL, "patient": {"patient_id": patient_id, "note": note}})
    assert r.status_code == 200, r.text
    first = r.json()["decision_id"]
    with svc.client("review") as c:
        r = c.post(f"/v1/decisions/{first}/reviews", json={"changes": [change]})
    assert r.status_code == 200, r.text
    return first, r.json()["decision_id"]


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory, scripted):
    """An audit store with a correction (evidence in the note), one whose evidence is not in the
    note, and a trial revision that changes one criterion."""
    svc = service(tmp_path_factory.mktemp("reviewed"), scripted)
    try:
        ids = {
            "good": match_and_review(svc, "P1", NOTE, CORRECT),
            "not_in_note": match_and_review(svc, "P2", NOTE_2, NOT_IN_NOTE),
        }
        with svc.client("trial_owner") as o:
            r = o.post(
                f"/v1/trials/{TRIAL}/revisions", json={"program": program(age_min=21), "reason": "age 21"}
            )
        assert r.status_code == 200, r.text
    finally:
        svc.stop()
    return svc, ids


def export_cli(*args, command=("serve", "export-reviews")) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*verdict_command(), *command, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]


def test_reviews_export_as_checked_private_records_with_provenance(reviewed, tmp_path):
    svc, ids = reviewed
    out = tmp_path / "site-sft"
    r = export_cli(svc.folder / "audit.sqlite", "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"not exported (evidence_not_in_note): 1: {ids['not_in_note'][1]}" in r.stdout
    miner = rows(out / "value_miner")
    assert miner and all(row["trial_id"] == TRIAL and row["patient_id"] == "P1" for row in miner)
    for row in miner:
        values = {v["atom"]: v for v in json.loads(row["messages"][-1]["content"])["values"]}
        assert values["creatinine"] == {
            "atom": "creatinine",
            "value": 1.3,
            "evidence": "creatinine 1.3 mg/dL today",
        }
        assert "creatinine 1.3 mg/dL today" in row["messages"][1]["content"]  # the passage is in the prompt
        prov = json.loads(row["provenance"])
        assert prov["decision_ids"] == [ids["good"][1]] and prov["reviewer_roles"] == ["review"]
        assert prov["data_class"] == "private" and prov["reviewed_at"][0].startswith(time.strftime("%Y-"))
        reviewer_key_id = svc.keys["review"].split("_")[1]
        assert reviewer_key_id not in json.dumps(row) and "test-review" not in json.dumps(row)
    parser = rows(out / "parser")
    assert [row["record_id"].split("#")[-1] for row in parser] == ["inc_age"]  # only the revised criterion
    target = json.loads(parser[0]["messages"][-1]["content"])
    assert target["formula"]["rhs"] == 21 and "Age 21 or older" in parser[0]["messages"][-2]["content"]
    card = json.loads((out / "value_miner" / "dataset_card.json").read_text())
    assert card["data_class"] == "private" and "patient text" in card["data_rules"]
    assert card["review_export"]["skipped"]["evidence_not_in_note"]["ids"] == [ids["not_in_note"][1]]
    assert "Data class: `private`" in (out / "value_miner" / "README.md").read_text()
    # the records load as a training set (train/'s checks)
    from verdict.train.sft_data import load_checked

    assert len(load_checked(out / "value_miner", "value_miner", ["train"])["train"]) == len(miner)


def test_without_stored_notes_the_decisions_are_reported_by_id(tmp_path, scripted):
    svc = service(tmp_path / "no-notes", scripted, store_notes=False)
    try:
        _, reviewed_id = match_and_review(svc, "P1", NOTE, CORRECT)
    finally:
        svc.stop()
    # the old spelling still runs it, and says where it went
    r = export_cli(
        "--from-reviews",
        svc.folder / "audit.sqlite",
        "--out",
        tmp_path / "out",
        command=("teacher", "export"),
    )
    assert r.returncode == 0, r.stderr
    assert "moved to `verdict serve export-reviews`" in r.stderr
    assert f"not exported (no_note): 1: {reviewed_id}" in r.stdout
    assert (tmp_path / "out" / "value_miner" / "train.jsonl").read_text() == ""


def test_the_export_refuses_a_destination_off_the_allowlist(reviewed, tmp_path):
    svc, _ = reviewed
    r = export_cli(svc.folder / "audit.sqlite", "--out", "https://datasets.example.com/site")
    assert r.returncode != 0 and "datasets.example.com" in r.stderr and "patient text" in r.stderr
    assert "Traceback" not in r.stderr
    r = export_cli(
        "run-a",
        "--from-reviews",
        svc.folder / "audit.sqlite",
        "--out",
        tmp_path / "x",
        command=("teacher", "export"),
    )
    assert r.returncode != 0 and "not both" in r.stderr
