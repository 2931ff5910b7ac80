"""`verdict match rescreen` (issue 12): re-deciding stored resolved patients with the core, no LLM
call, after a policy changed version (the reference corpus: 76 recorded pairs) or a trial got a new
program version; resumable and idempotent; the chain verifies afterwards."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.serve.conftest import verdict_command
from tests.support import REFERENCE_V6, REPO, need

OLD_POLICY = """name: site-policy
version: "1"
description: prescreening (chart silence deferred to the visit)
rules:
  - {id: defer-to-visit, action: unresolved, reason: "The note is silent; deferred to the screening visit."}
"""
NEW_POLICY = """name: site-policy
version: "2"
description: the site now reads chart silence strictly
rules:
  - {id: inclusion-not-documented, match: {sides: [inclusion]}, action: impute, value: not_established,
     reason: "Not documented in the chart, so the inclusion requirement is not met."}
  - {id: exclusion-not-documented, match: {sides: [exclusion]}, action: impute, value: not_established,
     reason: "Not documented in the chart, so the exclusion does not apply."}
"""


def core_patient(case, policy):
    """The core's own resolution of a recorded pair: the policy over the open atoms, except atoms the
    import set aside (contradicting records: no policy imputes over them)."""
    from verdict.core.policy import apply_policy

    aside = {a for c in case.conflicts for a in c.set_aside}
    patient = apply_policy(case.program, case.patient, policy)
    original = case.patient.by_atom()
    return patient.model_copy(
        update={"resolutions": [original[r.atom] if r.atom in aside else r for r in patient.resolutions]}
    )


def store_decision(store, engine, program, patient, policy, conflicts=()):
    d = engine.decide(program, patient)
    return store.add_decision(
        created_by="loader", trial_id=program.trial_id, program_hash=program.content_hash,
        patient_id=patient.patient_id, note_hash="sha256:none", patient_hash=patient.content_hash(),
        policy_name=policy.name, policy_version=policy.version, engine_version="test", decision=d.decision,
        models={"parser": None, "value_miner": "recorded-v6"}, timings={},
        artifacts={"decision": d.model_dump(mode="json", by_alias=True),
                   "patient": patient.model_dump(mode="json"),
                   "extraction_conflicts": [c.model_dump(mode="json") for c in conflicts]},
        note_text=None,
    )  # fmt: skip


def run_rescreen(db, config_dir, *args):
    env = {**os.environ, "VERDICT_CONFIG_DIR": str(config_dir)}
    return subprocess.run(
        [*verdict_command(), "match", "rescreen", "--db", str(db), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )


def test_rescreen_after_a_policy_change_on_the_reference_corpus(tmp_path):
    need(REFERENCE_V6.is_dir(), f"reference corpus missing: {REFERENCE_V6}")
    from verdict.core.engine import Engine
    from verdict.core.policy import load_policy
    from verdict.core.reference import load_reference
    from verdict.serve.audit import AuditStore

    (tmp_path / "configs" / "policies").mkdir(parents=True)
    policy_file = tmp_path / "configs" / "policies" / "site-policy.yaml"
    policy_file.write_text(OLD_POLICY)
    old = load_policy(policy_file)
    new_file = tmp_path / "new.yaml"
    new_file.write_text(NEW_POLICY)
    new = load_policy(new_file)
    engine = Engine(timeout_ms=5000)
    store = AuditStore(tmp_path / "audit.sqlite")
    cases, expected = {}, {}
    for path in sorted(REFERENCE_V6.glob("*/*.json")):
        case = load_reference(path)
        p = case.program
        if store.trial_version(p.trial_id, p.content_hash) is None:
            store.add_trial(
                trial_id=p.trial_id,
                program_hash=p.content_hash,
                origin="upload",
                created_by="loader",
                program_json=p.model_dump_json(by_alias=True),
            )
        row = store_decision(store, engine, p, core_patient(case, old), old, case.conflicts)
        cases[row.decision_id] = case
        direct = engine.decide(p, core_patient(case, new)).decision
        if direct != row.decision:
            expected[row.decision_id] = (row.decision, direct)
    store.close()
    assert len(cases) == 76
    assert expected  # the stricter reading changes some decisions
    policy_file.write_text(NEW_POLICY)  # the site's policy changes version

    r = run_rescreen(
        tmp_path / "audit.sqlite",
        tmp_path / "configs",
        "--policy",
        "site-policy",
        "--out",
        str(tmp_path / "rescreen.json"),
    )
    assert r.returncode == 0, r.stderr
    assert "LLM calls: 0" in r.stderr
    report = json.loads((tmp_path / "rescreen.json").read_text())
    assert report["llm_calls"] == 0 and report["trigger"] == {"policy": "site-policy", "version": "2"}
    changed = {
        it["decision_id"]: (it["old"], it["new"]) for it in report["items"] if it["status"] == "changed"
    }
    assert changed == expected
    assert report["counts"] == {"changed": len(expected), "unchanged": 76 - len(expected)}
    for did, (old_label, new_label) in expected.items():  # the table: old and new side by side
        assert any(did in line and old_label in line and new_label in line for line in r.stdout.splitlines())

    store = AuditStore(tmp_path / "audit.sqlite")
    assert store.count("decisions") == 76 + len(expected)
    for it in report["items"]:
        if it["status"] == "changed":
            new_row = store.decision(it["new_decision_id"])
            assert new_row.parent_id == it["decision_id"] and new_row.lineage["kind"] == "rescreen"
            assert (new_row.policy_version, new_row.decision) == ("2", it["new"])
            assert store.successor(it["decision_id"]) == it["new_decision_id"]
    assert store.verify().ok
    store.close()

    again = run_rescreen(
        tmp_path / "audit.sqlite",
        tmp_path / "configs",
        "--policy",
        "site-policy",
        "--out",
        str(tmp_path / "again.json"),
    )
    assert again.returncode == 0, again.stderr
    second = json.loads((tmp_path / "again.json").read_text())
    assert "changed" not in second["counts"] and second["llm_calls"] == 0  # idempotent: nothing new written
    store = AuditStore(tmp_path / "audit.sqlite", read_only=True)
    assert store.count("decisions") == 76 + len(expected) and store.verify().ok
    store.close()


def test_rescreen_for_a_new_program_version_reuses_values_only_when_the_atoms_are_unchanged(tmp_path):
    from verdict.core.engine import Engine
    from verdict.core.patient import Resolution, ResolvedPatient
    from verdict.core.policy import load_policy
    from verdict.core.program import TrialProgram, check_program
    from verdict.serve.audit import AuditStore

    from tests.serve.test_reviews import atom, program

    def checked(data):
        return check_program(TrialProgram.model_validate(data))

    engine, prescreen = Engine(timeout_ms=5000), load_policy("prescreen")
    store = AuditStore(tmp_path / "audit.sqlite")
    rows = {}
    for tid in ("T-SAME", "T-NEW-ATOM"):
        v1 = checked(program(tid))
        store.add_trial(
            trial_id=tid,
            program_hash=v1.content_hash,
            origin="upload",
            created_by="k",
            program_json=v1.model_dump_json(by_alias=True),
        )
        patient = ResolvedPatient(
            patient_id="P1",
            trial_id=tid,
            program_hash=v1.content_hash,
            resolutions=[
                Resolution(atom="age_years", status="observed", value=45, evidence="45 years old"),
                Resolution(atom="has_t2dm", status="observed", value=True, evidence="T2DM"),
                Resolution(atom="creatinine", status="observed", value=1.2, evidence="Cr 1.2"),
                Resolution(atom="pregnant", status="observed", value=False, evidence="not pregnant"),
            ],
        )
        from verdict.core.policy import apply_policy

        rows[tid] = store_decision(store, engine, v1, apply_policy(v1, patient, prescreen), prescreen)
        assert rows[tid].decision == "eligible"
    same = checked(program("T-SAME", age_min=50))  # same atoms, a stricter threshold
    extra = program("T-NEW-ATOM")
    extra["atoms"].append(atom("on_dialysis", definition="Is on dialysis."))
    extra["cohorts"][0]["exclusion"].append(
        {"id": "exc_dialysis", "text": "Dialysis", "formula": "on_dialysis"}
    )
    for p in (same, checked(extra)):
        store.add_trial(
            trial_id=p.trial_id,
            program_hash=p.content_hash,
            origin="revision",
            created_by="k",
            program_json=p.model_dump_json(by_alias=True),
            details={"revises": "v1", "reason": "x"},
        )
    store.close()
    config_dir = tmp_path / "configs"
    config_dir.mkdir(exist_ok=True)  # no site policy: the shipped ones decide
    r = run_rescreen(
        tmp_path / "audit.sqlite", config_dir, "--trial", "T-SAME", "--out", str(tmp_path / "a.json")
    )
    assert r.returncode == 0, r.stderr
    a = json.loads((tmp_path / "a.json").read_text())
    assert [(it["status"], it["old"], it["new"]) for it in a["items"]] == [
        ("changed", "eligible", "ineligible")
    ]
    assert a["items"][0]["new_version"] == same.content_hash and a["llm_calls"] == 0
    r = run_rescreen(
        tmp_path / "audit.sqlite", config_dir, "--trial", "T-NEW-ATOM", "--out", str(tmp_path / "b.json")
    )
    b = json.loads((tmp_path / "b.json").read_text())
    assert [it["status"] for it in b["items"]] == ["needs_miner"] and "needs_miner" in r.stdout
    again = run_rescreen(
        tmp_path / "audit.sqlite", config_dir, "--trial", "T-SAME", "--out", str(tmp_path / "c.json")
    )
    assert json.loads((tmp_path / "c.json").read_text())["items"] == [] and again.returncode == 0
    store = AuditStore(tmp_path / "audit.sqlite", read_only=True)
    assert store.count("decisions") == 3 and store.verify().ok
    store.close()


def test_rescreen_refuses_unclear_requests(tmp_path):
    r = run_rescreen(tmp_path / "audit.sqlite", tmp_path, "--policy", "prescreen", "--trial", "T")
    assert r.returncode != 0 and "--policy NAME or --trial ID" in r.stderr
    r = run_rescreen(tmp_path / "none.sqlite", tmp_path, "--trial", "T-UNKNOWN")
    assert r.returncode != 0 and "no trial 'T-UNKNOWN'" in r.stderr


def test_the_call_counter_counts_a_real_formalizer_call():
    """The 0 above means something: a call sent inside the counter is counted (scripted server)."""
    import asyncio

    from verdict.data_gen.formalizer.client import EndpointClient, build_request
    from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
    from verdict.data_gen.scripted_server import Script, ScriptedServer
    from verdict.serve.reviews.rescreen import count_llm_calls

    srv = ScriptedServer(Script.model_validate({"default": {"content": {"ok": True}}})).start()
    try:
        t = EndpointConfig(name="scripted", base_url=srv.url, model="scripted", max_retries=0)

        async def go():
            c = EndpointClient(t)
            try:
                req = build_request(t, "parser", [{"role": "user", "content": "hi"}], None, "x")
                return await c.complete(req, carries_patient_text=False)
            finally:
                await c.aclose()

        with count_llm_calls() as calls:
            asyncio.run(go())
        assert calls["calls"] == 1 and len(srv.requests) == 1
    finally:
        srv.stop()


@pytest.fixture(autouse=True)
def _quiet_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default report folder (runs/match) lands in the test's folder
