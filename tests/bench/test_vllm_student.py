"""Verdict with local students on a real vLLM CPU server (the tiny student whose LoRA adapters were
trained on the teacher's outputs, `tests/fixtures/vllm.py`) against the API teacher (the scripted
server answering those outputs) and the untrained base model: the Table 2 comparison in miniature.

How well the tiny adapters reproduce their teacher is the fixture's business (and varies with it);
what is checked here is that the benchmark measures real student outputs correctly: every pair gets
a result, validity comes from the actual answers, the agreement and McNemar figures match the
per-pair decisions, and local calls cost nothing but are timed and counted."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from verdict.bench import metrics as M
from verdict.bench.bench_config import load_bench_config
from verdict.bench.protocol import PairResult
from verdict.bench.runner import BenchRun
from verdict.data_gen.formalizer import REASONS
from verdict.data_gen.scripted_server import ScriptedServer

from tests.fixtures.vllm import STUDENT_MAX_TOKENS

from . import scenario

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

TRAINED_ON = {
    k: v for k, v in scenario.LABELS.items() if k[1] != "NCT-BAD-03"
}  # the adapters' 2 trials x 3 notes


def student(server, model: str, **over) -> dict:
    return {
        "name": f"student-{model}",
        "base_url": server.base_url,
        "model": model,
        "structured_output": "vllm",
        "max_tokens": STUDENT_MAX_TOKENS,
        "timeout_s": 300,
        "concurrency": 2,
        "max_retries": 1,
        **over,
    }


def test_local_students_vs_the_api_teacher(vllm_server, tmp_path):
    with ScriptedServer(scenario.script()) as srv:
        teacher = scenario.endpoint(srv.url)
        base = student(
            vllm_server, "base", max_tokens={"parser": 96, "miner_inclusion": 64, "miner_exclusion": 64}
        )
        cfg = scenario.write_config(
            tmp_path,
            srv.url,
            labels=TRAINED_ON,
            malformed=False,
            concurrency=2,
            backends=[
                {"name": "teacher", "kind": "formalizer", "parser": teacher, "miner": teacher},
                {
                    "name": "distilled",
                    "kind": "formalizer",
                    "parser": student(vllm_server, "parser"),
                    "miner": student(vllm_server, "value_miner"),
                },
                {"name": "base", "kind": "formalizer", "parser": base, "miner": base},
            ],
        )
        out = asyncio.run(
            BenchRun(load_bench_config(str(cfg)), progress_bar=False, progress=lambda m: None).run()
        )
    assert out.status == "complete", (out.message, (out.run_dir / "run.log").read_text()[-3000:])
    s = json.loads((out.run_dir / "results.json").read_text())
    pairs = [
        PairResult.model_validate_json(x) for x in (out.run_dir / "pairs.jsonl").read_text().splitlines()
    ]
    by = {(r.backend, r.pair_id): r for r in pairs}
    assert s["backends"]["teacher"]["coverage"]["decided"] == 6
    for name in ("distilled", "base"):
        b = s["backends"][name]
        c = b["coverage"]
        assert c["decided"] + c["failed"] == 6 and c["missing"] == 0, name  # every pair has a result
        rs = [r for r in pairs if r.backend == name]
        for r in rs:  # a failure names the formalizer's rejection category, never a crash
            assert r.status == "decided" or any(f"({x})" in (r.reason or "") for x in REASONS), r.reason
        # validity comes from the students' actual first answers, the parser once per trial
        parser_first = {r.trial_id: r.stages["parser"].first_reason for r in rs}
        v = b["validity"]["parser"]
        assert v["n"] == 2
        assert v["json_valid"]["k"] == sum(
            x not in ("json", "empty", "truncated") for x in parser_first.values()
        )
        assert v["valid_first_try"]["k"] == sum(x is None for x in parser_first.values())
        # local calls: no price, but tokens and model time are measured
        assert b["cost_usd"]["total"] == 0 and b["tokens"]["completion_total"] > 0
        assert b["latency_ms"]["stages"]["parser"]["p50"] > 0
    # the comparison is what the per-pair decisions say
    [cmp] = [c for c in s["comparisons"] if (c["a"], c["b"]) == ("teacher", "distilled")]
    ids = sorted({p for _, p in by})
    t = [by[("teacher", p)].decision == "eligible" for p in ids]
    d = [
        by[("distilled", p)].status == "decided" and by[("distilled", p)].decision == "eligible" for p in ids
    ]
    assert cmp["pairs"] == 6 and cmp["decisions"] == M.agreement(t, d)
    # the core is deterministic across backends: the same program and facts give the same decision
    same = [
        p
        for p in ids
        if by[("distilled", p)].patient_hash
        and (by[("distilled", p)].program_hash, by[("distilled", p)].patient_hash)
        == (by[("teacher", p)].program_hash, by[("teacher", p)].patient_hash)
    ]
    assert all(by[("distilled", p)].decision == by[("teacher", p)].decision for p in same)
    print(
        "distilled vs teacher:",
        Counter(
            (by[("distilled", p)].status, by[("distilled", p)].decision == by[("teacher", p)].decision)
            for p in ids
        ),
        f"{len(same)} identical facts",
    )
