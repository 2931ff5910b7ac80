"""`verdict bench run` end to end against the scripted OpenAI-compatible server (real HTTP)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from verdict.bench.bench_config import load_bench_config
from verdict.bench.protocol import BenchError, PairResult
from verdict.bench.runner import BenchRun
from verdict.data_gen.formalizer.errors import EgressRefused
from verdict.data_gen.scripted_server import ScriptedServer

from tests.support import VERDICT

from . import scenario

CLI = VERDICT


def run(cfg_path, *sets, **kw):
    cfg = load_bench_config(str(cfg_path), list(sets))
    return asyncio.run(BenchRun(cfg, progress_bar=False, progress=lambda m: None, **kw).run())


def pair_results(run_dir: Path) -> list[PairResult]:
    return [PairResult.model_validate_json(x) for x in (run_dir / "pairs.jsonl").read_text().splitlines()]


@pytest.fixture
def server():
    with ScriptedServer(scenario.script()) as srv:
        yield srv


def test_scores_validity_cost_and_agreement_by_hand(tmp_path, server):
    cfg = scenario.write_config(tmp_path, server.url)
    out = run(cfg)
    assert out.status == "complete" and out.done_now == 14
    s = json.loads((out.run_dir / "results.json").read_text())
    v, m = s["backends"]["verdict-scripted"], s["backends"]["llmmatch-scripted"]
    # see tests/bench/scenario.py for the table these come from
    assert v["metrics"]["confusion"] == {"tp": 2, "fp": 2, "fn": 1, "tn": 2}
    assert v["metrics"]["f1"]["value"] == pytest.approx(4 / 7)
    assert v["metrics"]["accuracy"]["value"] == pytest.approx(4 / 7)
    assert m["metrics"]["confusion"] == {"tp": 2, "fp": 0, "fn": 1, "tn": 4}
    assert m["metrics"]["f1"]["value"] == pytest.approx(0.8)
    assert v["coverage"]["failed"] == 1
    assert v["failures"] == {"parser output rejected after one repair (undeclared_atom)": 1}
    # validity: the parser's third trial fails twice; one miner answer is cut off, then repaired
    assert v["validity"]["parser"]["valid_first_try"]["k"] == 2 and v["validity"]["parser"]["n"] == 3
    assert v["validity"]["parser"]["accepted_after_repair"]["k"] == 2
    assert v["validity"]["miner_inclusion"]["json_valid"]["k"] == 5
    assert v["validity"]["miner_inclusion"]["accepted_after_repair"]["k"] == 6
    # cost: 10 parser calls (one per criterion: 3 + 3 + 2, and the bad trial's 2 repairs) + 12 miner
    # calls + 1 repair, $0.0028 each, 7 pairs
    assert v["cost_usd"]["calls"] == 23 and v["cost_usd"]["total"] == pytest.approx(23 * scenario.CALL_USD)
    assert v["cost_usd"]["per_pair"] == pytest.approx(23 * scenario.CALL_USD / 7)
    assert v["tokens"]["prompt_total"] == 23000
    assert m["cost_usd"]["per_pair"] == pytest.approx(scenario.CALL_USD)
    assert set(v["latency_ms"]["stages"]) == {"parser", "miner_inclusion", "miner_exclusion", "solve"}
    assert v["latency_ms"]["pair"]["n"] == 6 and v["latency_ms"]["pair"]["p50"] > 0
    # the formal counterfactuals flip every decision that has pivotal conditions
    pf = v["pivotal_flip_rate"]
    assert (pf["to_eligible"]["k"], pf["to_eligible"]["n"]) == (2, 2)
    assert (pf["to_ineligible"]["k"], pf["to_ineligible"]["n"]) == (4, 4)
    assert "pivotal_flip_rate" not in m
    [c] = s["comparisons"]
    assert c["pairs"] == 7 and c["decisions"]["a_only"] == 3 and c["decisions"]["b_only"] == 1
    assert c["decisions"]["mcnemar_p"] == pytest.approx(0.625)
    assert c["correctness"] == {"a_right_b_wrong": 1, "b_right_a_wrong": 3, "mcnemar_p": pytest.approx(0.625)}
    # outputs
    for f in (
        "report.md",
        "config.yaml",
        "dataset.json",
        "plots/f1.png",
        "plots/latency_cost.png",
        "plots/confusion.png",
    ):
        assert (out.run_dir / f).stat().st_size > 0
    assert (out.run_dir / "plots" / "f1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out.run_dir / "report.md").read_text()
    assert "| verdict-scripted | formalizer | 7 | 0.571" in report


def test_malformed_rows_are_reported_and_never_scored(tmp_path, server):
    out = run(scenario.write_config(tmp_path, server.url))
    s = json.loads((out.run_dir / "results.json").read_text())
    assert s["dataset"]["pairs"] == 7 and s["dataset"]["skipped"] == 3
    assert s["dataset"]["problems"] == [
        "pairs.jsonl:4: 'label' must be eligible/ineligible (or true/false)",
        "pairs.jsonl:5: needs 'patient_id' and 'trial_id' (or 'nct_id')",
        "pairs.jsonl:6: not valid JSON (Expecting property name enclosed in double quotes)",
    ]
    scored = {r.pair_id for r in pair_results(out.run_dir)}
    assert scored == {f"{p}__{t}" for p, t in scenario.LABELS}  # nothing from the bad rows
    assert "pairs.jsonl:5: needs 'patient_id' and 'trial_id'" in (out.run_dir / "report.md").read_text()


def test_rerun_resumes_and_pays_nothing(tmp_path, server):
    cfg = scenario.write_config(tmp_path, server.url)
    first = run(cfg)
    sent = len(server.requests)
    before = json.loads((first.run_dir / "results.json").read_text())
    again = run(cfg)
    assert len(server.requests) == sent  # every pair was recorded: nothing is asked again
    assert again.done_before == 14 and again.done_now == 0 and again.paid_usd == 0
    after = json.loads((again.run_dir / "results.json").read_text())
    assert after["backends"] == before["backends"]
    # a fresh run directory over the same cache decides everything again without a single paid call
    fresh = run(cfg, "name=scenario-2")
    assert len(server.requests) == sent and fresh.done_now == 14 and fresh.paid_usd == 0
    s2 = json.loads((fresh.run_dir / "results.json").read_text())
    assert s2["backends"]["verdict-scripted"]["metrics"] == before["backends"]["verdict-scripted"]["metrics"]
    assert s2["backends"]["verdict-scripted"]["cost_usd"]["paid"] == 0
    # every call of the first run (the parser's per criterion)
    assert s2["backends"]["verdict-scripted"]["cost_usd"]["cache_hits"] == 23


def test_a_pair_line_torn_by_a_kill_is_redone_and_nothing_is_lost(tmp_path, server):
    """Killed between two writes (r1 kept, r2 half-written, the rest never written): the resumed run
    cuts the torn line and records r2 and every other pair once, each on a line of its own."""
    cfg = scenario.write_config(tmp_path, server.url)
    first = run(cfg)
    pairs = first.run_dir / "pairs.jsonl"
    r1, r2 = pairs.read_text().splitlines(keepends=True)[:2]
    pairs.write_text(r1 + r2[: len(r2) // 2])
    again = run(cfg)
    assert again.done_before == 1 and again.done_now == 13
    results = pair_results(first.run_dir)  # every line reads: nothing glued to the torn one
    assert len(results) == 14 and len({x.key for x in results}) == 14
    assert {x.key: x.decision for x in results} == {
        x.key: x.decision for x in map(PairResult.model_validate_json, [r1, r2])
    } | {x.key: x.decision for x in results}


def test_resume_after_kill_9(tmp_path):
    """Kill the run mid-way (SIGKILL): a second run finishes it, every pair once, no answered call
    sent again."""
    with ScriptedServer(scenario.script(latency=0.15)) as srv:
        cfg = scenario.write_config(tmp_path, srv.url, concurrency=2)
        run_dir = tmp_path / "runs" / "scenario"
        proc = subprocess.Popen(
            [*CLI, "bench", "run", "-c", str(cfg), "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        pairs = run_dir / "pairs.jsonl"
        deadline = time.time() + 90
        while time.time() < deadline:
            if pairs.exists() and len(pairs.read_text().splitlines()) >= 3:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        n_before = len(pairs.read_text().splitlines())
        assert 3 <= n_before < 14
        db = sqlite3.connect(tmp_path / "runs" / "cache.sqlite")
        answered = {k for (k,) in db.execute("SELECT key FROM calls")}
        in_flight = {k for (k,) in db.execute("SELECT key FROM inflight")}
        db.close()
        r = subprocess.run(
            [*CLI, "bench", "run", "-c", str(cfg), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr
        assert f"{n_before} before" in r.stdout
        results = pair_results(run_dir)
        keys = Counter(x.key for x in results)
        assert len(keys) == 14 and max(keys.values()) == 1  # every pair exactly once
        counts = Counter(x.request_id for x in srv.requests)
        resent = {k for k, c in counts.items() if c > 1}
        assert not resent & answered  # no call whose answer was stored is ever sent again
        assert resent <= in_flight  # only calls in flight at the kill (their answers never arrived)
    with ScriptedServer(scenario.script()) as srv2:  # the same decisions as an uninterrupted run
        ref = run(scenario.write_config(tmp_path / "ref", srv2.url))
    want = {x.key: x.decision for x in pair_results(ref.run_dir)}
    assert {x.key: x.decision for x in results} == want


def test_repeats_measure_consistency_and_really_ask_again(tmp_path, server):
    out = run(scenario.write_config(tmp_path, server.url, repeats=2))
    s = json.loads((out.run_dir / "results.json").read_text())
    v = s["backends"]["verdict-scripted"]["consistency"]
    assert v["repeats"] == 2 and (v["same_decision"]["k"], v["same_decision"]["n"]) == (6, 6)
    assert v["same_facts_same_decision"]["rate"] == 1.0
    assert s["backends"]["llmmatch-scripted"]["consistency"]["same_decision"]["n"] == 7
    # repeat 1 has its own cache: each of the 30 calls of repeat 0 (the parser's per criterion) was
    # sent a second time
    assert len(server.requests) == 60
    assert (out.run_dir / "cache-repeat-1.sqlite").exists()


def test_inconsistent_repeats_are_counted(tmp_path):
    """A matcher that answers differently the second time it is asked is not consistent."""
    sc = scenario.script()
    for rule in sc.rules:
        if scenario.MATCH_MARK in rule.match.contains and "Trial NCT-DM-01:" in rule.match.contains:
            flipped = dict(
                json.loads(rule.responses[0].content)
                if isinstance(rule.responses[0].content, str)
                else rule.responses[0].content
            )
            flipped["verdict"] = "ineligible" if flipped["verdict"] == "eligible" else "eligible"
            rule.responses.append(scenario.ok(flipped))
    with ScriptedServer(sc) as srv:
        cfg = scenario.write_config(
            tmp_path,
            srv.url,
            repeats=2,
            backends=[{"name": "llm", "kind": "llm_match", "endpoint": scenario.endpoint(srv.url)}],
        )
        out = run(cfg)
    c = json.loads((out.run_dir / "results.json").read_text())["backends"]["llm"]["consistency"][
        "same_decision"
    ]
    assert (c["k"], c["n"]) == (4, 7)  # the three DM pairs changed their verdict


def test_budget_stops_cleanly_and_resumes(tmp_path, server):
    # one call at a time (a call reserves its worst case, $0.0346, before it is sent; the parser's
    # criterion calls of a trial would otherwise reserve together)
    ep = scenario.endpoint(server.url, concurrency=1)
    cfg = scenario.write_config(
        tmp_path,
        server.url,
        budget_usd=0.05,
        concurrency=1,
        backends=[
            {"name": "verdict-scripted", "kind": "formalizer", "parser": ep, "miner": ep},
            {"name": "llmmatch-scripted", "kind": "llm_match", "endpoint": ep, "max_tokens": 512},
        ],
    )
    out = run(cfg)
    assert out.status == "stopped_budget" and "budget stop" in out.message
    spent = sum(1 for r in server.requests if r.kind in ("ok", "truncated")) * scenario.CALL_USD
    assert spent <= 0.05 + 1e-9
    done = len(pair_results(out.run_dir))
    assert 0 < done < 14
    out2 = run(cfg, "budget_usd=1.0")
    assert out2.status == "complete" and out2.done_before == done


def test_private_notes_never_go_to_a_remote_endpoint(tmp_path, server):
    ep = scenario.endpoint("https://api.example.com/v1")
    cfg = scenario.write_config(
        tmp_path, server.url, backends=[{"name": "remote", "kind": "formalizer", "parser": ep, "miner": ep}]
    )
    scenario.set_dataset(cfg, data_class="private")
    with pytest.raises(EgressRefused, match="api.example.com"):
        run(cfg)
    assert not server.requests
    assert not (tmp_path / "runs" / "scenario" / "pairs.jsonl").exists()


def test_a_changed_config_is_not_mixed_into_old_results(tmp_path, server):
    cfg = scenario.write_config(tmp_path, server.url)
    run(cfg)
    with pytest.raises(BenchError, match="holds results of another config .policy differ"):
        run(cfg, "policy=strict")
    out = run(cfg, "policy=strict", restart=True)
    assert out.done_before == 0 and out.done_now == 14


def test_patient_text_stays_out_of_logs_and_reports(tmp_path, server):
    out = run(scenario.write_config(tmp_path, server.url))
    notes = [p["note"] for p in scenario.records()["patients"]]
    for name in ("run.log", "results.json", "report.md", "dataset.json"):
        text = (out.run_dir / name).read_text()
        for note in notes:
            for i in range(0, len(note) - 24, 8):
                assert note[i : i + 24] not in text, f"{name} quotes a note"
