"""Mined values reused across trials (data_gen/formalizer/value_reuse.py): one patient record, trials
that declare the same atom, the scripted formalizer over real HTTP counting what is asked."""

from __future__ import annotations

import asyncio
import json

from verdict.core.program import load_program
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.protocol import PatientDoc
from verdict.data_gen.formalizer.value_reuse import ValueReuse
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedServer
from verdict.data_gen.scripted_server import ScriptedResponse as R

from tests.data_gen.teacher_data import age_atom

from .teacher_data import teacher_config

NOTE = "A 58-year-old man with type 2 diabetes, HbA1c 8.1%, no chest pain."
VALUES = {
    "age_years": {"value": 58, "evidence": "58-year-old"},
    "has_t2dm": {"value": True, "evidence": "type 2 diabetes"},
    "hba1c_percent": {"value": 8.1, "evidence": "HbA1c 8.1%"},
}


def _bool(name, definition=None):
    return {"name": name, "domain": "bool", "kind": "diagnosis", "definition": definition or f"Has {name}."}


def program(trial_id, *atoms):
    """Every atom an inclusion criterion of its own (all mined on the inclusion side)."""

    def formula(a):
        return a["name"] if a["domain"] == "bool" else {"op": "cmp", "lhs": a["name"], "rel": "ge", "rhs": 0}

    return load_program(
        {
            "trial_id": trial_id,
            "atoms": list(atoms),
            "cohorts": [
                {
                    "id": "main",
                    "inclusion": [
                        {"id": f"inc{i}", "text": a["name"], "formula": formula(a)}
                        for i, a in enumerate(atoms)
                    ],
                }
            ],
        }
    )


HBA1C = {
    "name": "hba1c_percent",
    "domain": "real",
    "kind": "lab_value",
    "unit": "%",
    "definition": "HbA1c in %.",
}
AGE = age_atom()
T1 = program("T1", AGE, _bool("has_t2dm"))
T2 = program("T2", AGE, HBA1C)  # shares age_years with T1
T3 = program("T3", AGE, _bool("has_t2dm"))  # everything shared with T1


def server(latency=0.0, fail_on=None) -> ScriptedServer:
    rules = (
        [Rule(match=Match(contains=[f'"name": "{fail_on}"']), responses=[R(fault="malformed_content")])]
        if fail_on
        else []
    )
    return ScriptedServer(
        Script(rules=rules, default=R(auto="nulls", auto_values=VALUES), default_latency_s=latency)
    ).start()


def asked_atoms(srv) -> list[str]:
    """Atom names each upstream call asked for (from its structured-output enum)."""
    out = []
    for r in srv.requests:
        schema = (r.body.get("response_format") or {}).get("json_schema", {}).get("schema") or {}
        out += (
            json.loads(json.dumps(schema))
            .get("$defs", {})
            .get("MinedValue", {})
            .get("properties", {})
            .get("atom", {})
            .get("enum", [])
        )
    return out


def mine(
    srv, programs, reuse=True, concurrent=False, patient=NOTE, cancel=None, max_tokens=None, prompts=None
):
    t = teacher_config(
        srv.url, timeout_s=10, max_retries=0, **({"max_tokens": max_tokens} if max_tokens else {})
    )

    async def go():
        fz = Formalizer(t, value_reuse=ValueReuse() if reuse else None, prompts=prompts)
        doc = PatientDoc(patient_id="P1", text=patient)
        try:
            if not concurrent:
                return [await fz.mine_values(p, doc, "inclusion") for p in programs], fz.value_reuse
            tasks = [asyncio.create_task(fz.mine_values(p, doc, "inclusion")) for p in programs]
            if cancel is not None:
                await asyncio.sleep(0.2)
                tasks[cancel].cancel()
            res = await asyncio.gather(*tasks, return_exceptions=True)
            return res, fz.value_reuse
        finally:
            await fz.aclose()

    return asyncio.run(go())


def values(res) -> dict:
    return {v.atom: (v.value, v.evidence) for v in res.output.values}


def test_a_shared_atom_is_mined_once_and_gives_the_same_values():
    srv = server()
    try:
        (r1, r2, r3), reuse = mine(srv, [T1, T2, T3])
        asked = asked_atoms(srv)
    finally:
        srv.stop()
    assert sorted(asked) == ["age_years", "has_t2dm", "hba1c_percent"]  # each asked once
    assert len(srv.requests) == 2 and r3.calls == [] and r3.assembly["reused_atoms"] == 2
    assert values(r2)["age_years"] == (58, "58-year-old") and values(r2)["hba1c_percent"] == (
        8.1,
        "HbA1c 8.1%",
    )
    assert values(r3) == values(r1)
    assert (reuse.asked, reuse.reused) == (3, 3)
    srv = server()
    try:
        fresh, _ = mine(srv, [T1, T2, T3], reuse=False)
    finally:
        srv.stop()
    assert [values(r) for r in fresh] == [values(r) for r in (r1, r2, r3)]  # reuse changes no value
    assert len(srv.requests) == 3


def test_a_different_declaration_or_record_is_asked_again():
    other = program("T4", age_atom("Age at enrolment in years."), _bool("has_t2dm", "Has T2DM."))
    srv = server()
    try:
        mine(srv, [T1, other])
        assert sorted(asked_atoms(srv)) == ["age_years", "age_years", "has_t2dm", "has_t2dm"]
    finally:
        srv.stop()
    srv = server()
    try:
        (a,), reuse = mine(srv, [T1])
        asked = asked_atoms(srv)
    finally:
        srv.stop()
    assert asked == ["age_years", "has_t2dm"] and reuse.reused == 0


def test_concurrent_trials_share_the_mining_in_progress():
    srv = server(latency=0.5)
    try:
        (r1, r3), _ = mine(srv, [T1, T3], concurrent=True)
        asked = asked_atoms(srv)
    finally:
        srv.stop()
    assert sorted(asked) == ["age_years", "has_t2dm"] and values(r1) == values(r3)


def test_cancelling_the_trial_that_started_the_mining_leaves_it_to_the_other():
    srv = server(latency=0.6)
    try:
        (r1, r3), _ = mine(srv, [T1, T3], concurrent=True, cancel=0)
        asked = asked_atoms(srv)
    finally:
        srv.stop()
    assert isinstance(r1, asyncio.CancelledError)
    assert values(r3)["has_t2dm"] == (True, "type 2 diabetes") and sorted(asked) == ["age_years", "has_t2dm"]


def test_a_failed_mining_is_not_kept_and_a_waiting_trial_asks_itself():
    """T2's mining fails (its hba1c call gets no JSON); T1, waiting on the age T2 was asking
    about, asks for it itself and is decided; nothing of the failure is reused."""
    srv = server(latency=0.3, fail_on="hba1c_percent")
    try:
        (r2, r1), reuse = mine(srv, [T2, T1], concurrent=True)
    finally:
        srv.stop()
    assert r2.status == "rejected" and r1.status == "accepted"
    assert values(r1)["age_years"] == (58, "58-year-old")
    assert reuse._pending == {}  # nothing left in progress


def test_an_atom_a_shared_mining_could_not_read_is_asked_again_not_taken_as_null():
    """One atom per call (dense v1 answers, max_tokens 150): T2's hba1c call fails, its age call
    stands, so T2 is accepted with hba1c left open. T5, waiting on that same hba1c, must not take
    it as silence: it asks itself (and, the answer failing again, is rejected rather than decided
    on a null)."""
    t5 = program("T5", HBA1C)
    srv = server(latency=0.3, fail_on="hba1c_percent")
    try:
        (r2, r5), _ = mine(
            srv,
            [T2, t5],
            concurrent=True,
            max_tokens={"parser": 64, "miner_inclusion": 150, "miner_exclusion": 64},
            prompts={"miner_inclusion": "v1"},
        )
        asked = asked_atoms(srv)
    finally:
        srv.stop()
    assert r2.status == "accepted" and list(r2.output.unread) == ["hba1c_percent"]
    assert values(r2)["age_years"] == (58, "58-year-old") and values(r2)["hba1c_percent"] == (None, "")
    assert r5.status == "rejected" and len(r5.calls) == 1  # its own call: the shared failure was not reused
    assert sorted(asked) == ["age_years"] + ["hba1c_percent"] * 4  # T2 call + repair, T5 call + repair
