"""The backends one by one: recorded (OR over variants), predictions, the direct matcher's adapter."""

import asyncio
import json

import pytest
from verdict.bench.backends import BACKENDS, RunContext, backend_config, make_backend
from verdict.bench.datasets import BenchDataset
from verdict.bench.protocol import BenchError, LabeledPair
from verdict.data_gen.formalizer.egress import EgressPolicy
from verdict.data_gen.scripted_server import ScriptedServer

from tests.support import REFERENCE_V6, need

from . import scenario


def ctx_for(tmp_path, pairs, **kw) -> RunContext:
    from verdict.core.engine import Engine
    from verdict.core.policy import load_policy

    return RunContext(
        dataset=BenchDataset(kind="test", pairs=pairs, **kw),
        engine=Engine(),
        policy=load_policy("prescreen"),
        run_name="t",
        run_dir=tmp_path,
        cache_path=tmp_path / "c.sqlite",
        egress=EgressPolicy(),
    )


def lp(pid, tid, label="eligible"):
    return LabeledPair(pair_id=f"{pid}__{tid}", patient_id=pid, trial_id=tid, label=label)


def test_recorded_is_the_or_over_variants(tmp_path):
    """A pair is eligible iff some variant is; checked against the variants' recorded satisfiability."""
    need(REFERENCE_V6.is_dir(), "shared reference corpus missing")
    # sigir-20141/NCT01356992: six variants, only 'a' has both sides recorded satisfiable
    pair = lp("sigir-20141", "NCT01356992")
    files = sorted((REFERENCE_V6 / "sigir-20141").glob("NCT01356992*__full.json"))
    sat = {
        f.name[:12]: all(json.loads(f.read_text())[s]["sat_like"] for s in ("inclusion", "exclusion"))
        for f in files
    }
    assert len(files) == 6 and [k for k, v in sat.items() if v] == ["NCT01356992a"]
    ctx = ctx_for(tmp_path, [pair])
    b = make_backend(backend_config({"name": "rec", "kind": "recorded", "path": str(REFERENCE_V6)}), ctx)
    r = asyncio.run(b.decide(pair, 0))
    assert (r.status, r.decision, r.variants) == ("decided", "eligible", 6)
    assert len(r.program_hash.split("+")) == 6 and r.flips
    # one variant, ineligible (inclusion side unsatisfiable in the recording)
    r2 = asyncio.run(b.decide(lp("sigir-20144", "NCT00162032"), 0))
    assert (r2.decision, r2.variants) == ("ineligible", 1)
    assert b.unavailable(lp("sigir-20141", "NCT99999999")) == "no recorded formalization of this pair"


def test_recorded_folder_must_exist(tmp_path):
    ctx = ctx_for(tmp_path, [])
    with pytest.raises(BenchError, match="reference folder not found"):
        make_backend(backend_config({"name": "rec", "kind": "recorded", "path": str(tmp_path / "nope")}), ctx)


def test_predictions_file_rows(tmp_path):
    f = tmp_path / "preds.jsonl"
    f.write_text(
        "\n".join(
            [
                json.dumps({"pair": "p1__T1", "eligibility": "eligible"}),
                json.dumps({"patient_id": "p2", "trial_id": "T1", "decision": False}),
                json.dumps({"pair": "p3__T1", "eligibility": "maybe"}),
                "{nope",
                json.dumps({"eligibility": "eligible"}),
            ]
        )
        + "\n"
    )
    ctx = ctx_for(tmp_path, [])
    b = make_backend(backend_config({"name": "ext", "kind": "predictions", "path": str(f)}), ctx)
    assert b.decisions == {"p1__T1": "eligible", "p2__T1": "ineligible"}
    assert b.problems() == [
        "ext: preds.jsonl:3: 'eligibility' must be eligible, ineligible or undetermined",
        "ext: preds.jsonl:4: not valid JSON (Expecting property name enclosed in double quotes)",
        "ext: preds.jsonl:5: needs 'pair' or 'patient_id' and 'trial_id'",
    ]
    assert b.unavailable(lp("p3", "T1")) == "no recorded decision for this pair"
    assert asyncio.run(b.decide(lp("p2", "T1", "eligible"), 0)).decision == "ineligible"


def test_direct_matcher_request_uses_its_template_schema_and_limit(tmp_path):
    """The adapter adds one stage to the shared Formalizer: its prompt template, its JSON schema
    under structured output, its own max_tokens; answers are cached like every formalizer call."""
    from verdict.data_gen.formalizer.protocol import PatientDoc, TrialDoc

    with ScriptedServer(scenario.script()) as srv:
        recs = scenario.records()
        t = recs["trials"][0]
        p = recs["patients"][0]
        trial = TrialDoc(
            trial_id=t["trial_id"], title=t["title"], inclusion=t["inclusion"], exclusion=t["exclusion"]
        )
        note = PatientDoc(patient_id=p["patient_id"], text=p["note"], data_class="synthetic")
        pair = lp(note.patient_id, trial.trial_id)
        ctx = ctx_for(tmp_path, [pair], patients={note.patient_id: note}, trials={trial.trial_id: trial})
        cfg = backend_config(
            {"name": "m", "kind": "llm_match", "endpoint": scenario.endpoint(srv.url), "max_tokens": 321}
        )
        b = make_backend(cfg, ctx)

        async def go():
            try:
                return [await b.decide(pair, 0), await b.decide(pair, 0)]
            finally:
                await b.aclose()

        r1, r2 = asyncio.run(go())
        ctx.close()
        assert r1.decision == "eligible" and r1.rationale == "scripted eligible"
        assert r1.stages["llm_match"].cached_calls == 0 and r2.stages["llm_match"].cached_calls == 1
        [req] = srv.requests  # the second decision came from the cache
        body = req.body
        assert body["max_tokens"] == 321
        schema = body["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["verdict"]["enum"] == ["eligible", "ineligible"]
        system = body["messages"][0]["content"]
        assert scenario.MATCH_MARK in system and "Trial NCT-DM-01" in body["messages"][1]["content"]


def test_every_registered_backend_has_a_strict_config():
    for kind, cls in BACKENDS.items():
        assert cls.config_class.model_config.get("extra") == "forbid", kind
