"""Shared by the page tests: a reference-corpus pair served for real (the scripted formalizer
replays the recorded values), and a browser-like HTTP login."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import httpx
from verdict.data_gen.formalizer import quote_in_note
from verdict.data_gen.recorded import recorded_evidence

from tests.support import REFERENCE_V6, SHARED_DATA, need

LARGEST = "sigir-20154/NCT01458405a"  # the reference program with the most criteria (67, 166 atoms)
LONGEST_NAME = "sigir-20149/NCT00132327a"  # the one with the longest atom name (188 characters)


@dataclass
class ReferencePair:
    program: object  # TrialProgram
    patient_id: str
    note: str
    values: dict[str, dict]  # atom -> {value, evidence}: what the scripted value miner answers


def reference_pair(stem: str = LARGEST) -> ReferencePair:
    """A recorded pair: its program, the patient's note, and the recorded observed values whose
    quotes the note holds (the rest the miner leaves null, as a checked miner would)."""
    need(REFERENCE_V6.exists(), f"shared reference corpus missing: {REFERENCE_V6}")
    from verdict.core.reference import load_reference

    pid, trial = stem.split("/")
    case = load_reference(REFERENCE_V6 / pid / f"{trial}__full.json")
    notes = SHARED_DATA / "benchmarks" / "patients_sigir.jsonl"
    note = next(json.loads(x)["text"] for x in notes.read_text().splitlines() if json.loads(x)["_id"] == pid)
    values = {}
    for r in case.patient.resolutions:
        if r.status == "observed" and r.value is not None:
            quote = recorded_evidence(r.evidence or "", note)
            if quote_in_note(quote, note):
                values[r.atom] = {"value": r.value, "evidence": quote}
    return ReferencePair(case.program, pid, note, values)


# The scripted server lists one model, "scripted": the service's health checks then find both stages' models.
SCRIPTED_MODELS = {"parser_model": "scripted", "value_miner_model": "scripted", "concurrency": 4}


def miner_script(*pairs: ReferencePair) -> dict:
    """A scripted-server script answering each pair's value-miner requests from its own values (a
    request is told by its note's opening words)."""
    rules = [
        {"match": {"contains": [p.note[:60]]}, "responses": [{"auto": "nulls", "auto_values": p.values}]}
        for p in pairs
    ]
    return {"rules": rules, "default": {"auto": "nulls"}}


def decide(svc, pair: ReferencePair) -> dict:
    """Upload the program (admin) and match the pair: the /v1/match answer."""
    with svc.client("admin") as c:
        r = c.post("/v1/trials", json={"program": pair.program.model_dump(mode="json", by_alias=True)})
        assert r.status_code == 200, r.text
        patient = {"patient_id": pair.patient_id, "note": pair.note}
        body = {"trial_id": pair.program.trial_id, "patient": patient}
        m = c.post("/v1/match", json=body)
        assert m.status_code == 200, m.text
        return m.json()


def login(url: str, key: str, next_: str = "/login") -> httpx.Client:
    """A client signed in through the login form, as a browser is (no key header)."""
    c = httpx.Client(base_url=url, trust_env=False, timeout=60)
    form = c.get("/login", params={"next": next_})
    assert form.status_code == 200
    token = re.search(r'name="login_token" value="([^"]+)"', form.text).group(1)
    r = c.post("/login", data={"login_token": token, "key": key, "next": next_})
    assert r.status_code == 303, r.text
    return c


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)
