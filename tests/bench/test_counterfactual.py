"""End-to-end counterfactual self-faithfulness (bench/counterfactual.py) against the scripted
OpenAI-compatible server, which plays the matcher, the modifier and the validator (real HTTP).

The dataset is the scenario with TREC grades (GRADES; score 0 decided for the ranking only, never
rewritten), so one run gives both the ranking and the counterfactual table. What the script makes
of the scored pairs (see tests/bench/scenario.py for the decisions):

    backend    pair            decision     flip targets      rewrite                      outcome
    formal     P2__NCT-DM-01   ineligible   δ (to_eligible)   CF-FLIP: the miner reads it  flipped
    formal     P3__NCT-CKD-02  ineligible   δ (to_eligible)   CF-MISS: the miner misses it not flipped
    formal     P1__NCT-DM-01   eligible     δ (to_ineligible) CF-MISS                      not flipped
    formal     P1__NCT-CKD-02  eligible     δ (to_ineligible) CF-MISS                      not flipped
    llm_match  P2__NCT-DM-01   ineligible   stated reasons    CF-REJECT: validator refuses rejected
    llm_match  P3__NCT-CKD-02  ineligible   stated reasons    CF-FLIP                      flipped
    llm_match  P1__NCT-CKD-02  ineligible   stated reasons    CF-MISS                      not flipped
    llm_match  P1__NCT-DM-01   eligible     none (one direction only)

CF-MISS keeps the chart's opening, so the scripted matcher answers as for the original chart.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
import yaml
from verdict.bench.bench_config import load_bench_config
from verdict.bench.runner import BenchRun
from verdict.data_gen.formalizer import side_atoms
from verdict.data_gen.formalizer.errors import EgressRefused
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedServer

from tests.fixtures.vllm import teacher_programs, teacher_values
from tests.support import VERDICT

from . import scenario

MODIFIER_MARK = "counterfactual test of a trial-matching system"
VALIDATOR_MARK = "checking a counterfactual edit"
FORMAL, STATED = "the matcher's formal conditions", "the matcher's stated reasons"
GRADES = {
    ("P1", "NCT-DM-01"): 2,
    ("P1", "NCT-CKD-02"): 1,
    ("P1", "NCT-BAD-03"): 0,
    ("P2", "NCT-DM-01"): 1,
    ("P2", "NCT-CKD-02"): 0,
    ("P3", "NCT-DM-01"): 0,
    ("P3", "NCT-CKD-02"): 1,
}


def cf_script() -> Script:
    recs = scenario.records()
    notes = {p["patient_id"]: p["note"] for p in recs["patients"]}
    p1 = next(p for p in recs["patients"] if p["patient_id"] == "P1")
    dm = teacher_programs(recs)["NCT-DM-01"]
    flip_note = f"CF-FLIP. {notes['P2']}\n{notes['P1']}"  # P1's facts for DM (eligible), quotable
    rewrites = {(p, t, kind): f"CF-MISS. {notes[p]}" for (p, t) in GRADES for kind in (FORMAL, STATED)}
    rewrites |= {
        ("P2", "NCT-DM-01", FORMAL): flip_note,
        ("P2", "NCT-DM-01", STATED): f"CF-REJECT. {notes['P2']}",
        ("P3", "NCT-CKD-02", STATED): f"CF-FLIP. {notes['P3']}",
    }
    rules = [
        Rule(
            match=Match(contains=[MODIFIER_MARK, notes[pid][:30], f"Trial {tid}:", kind]),
            responses=[scenario.ok({"modified_note": text, "edits": ["scripted"]})],
        )
        for (pid, tid, kind), text in rewrites.items()
    ]
    verdict = {"addresses_targets": True, "unrelated_changes": False, "new_blocker": False, "coherent": True}
    rules += [
        Rule(
            match=Match(contains=[VALIDATOR_MARK, "CF-REJECT"]),
            responses=[scenario.ok({**verdict, "unrelated_changes": True, "reason": "scripted"})],
        ),
        Rule(match=Match(contains=[VALIDATOR_MARK]), responses=[scenario.ok({**verdict, "reason": "ok"})]),
    ]
    for side in ("inclusion", "exclusion"):  # the miner reads the flipped chart: P1's DM facts
        values = [
            {"atom": v.atom, "value": v.value, "evidence": v.evidence}
            for v in teacher_values(recs, dm, p1, side)
        ]
        mark = ["CF-FLIP", f"Atoms ({side} side)"] + [f'"name": "{n}"' for n in side_atoms(dm, side)]
        rules.append(Rule(match=Match(contains=mark), responses=[scenario.ok({"values": values})]))
    answer = {
        "criteria": [{"criterion": "all", "side": "inclusion", "status": "met", "justification": "scripted"}],
        "verdict": "eligible",
        "rationale": "scripted eligible",
        "score": 80,
    }
    rules.append(
        Rule(
            match=Match(contains=[scenario.MATCH_MARK, "CF-FLIP", "Trial NCT-CKD-02:"]),
            responses=[scenario.ok(answer)],
        )
    )
    return Script(rules=rules + scenario.script().rules)


def cf_config(tmp_path, url, **cf):
    ep = scenario.endpoint(url)
    return scenario.write_trec_config(
        tmp_path,
        url,
        GRADES,
        name="cf",
        counterfactual={"enabled": True, "modifier": ep, "validator": ep, **cf},
    )


def run(cfg, **kw):
    return asyncio.run(
        BenchRun(load_bench_config(str(cfg)), progress_bar=False, progress=lambda m: None, **kw).run()
    )


def test_rewrites_validated_rerun_and_scored_then_a_rerun_pays_nothing(tmp_path):
    with ScriptedServer(cf_script()) as srv:
        cfg = cf_config(tmp_path, srv.url)
        out = run(cfg)
        assert out.status == "complete" and out.paid_usd > 0
        s = json.loads((out.run_dir / "results.json").read_text())
        rows = s["counterfactual"]["rows"]
        to_el = rows["verdict-scripted to_eligible"]
        # P2 x DM flips; P3 x CKD: the rewrite is accepted but the miner reads the old facts
        assert (to_el["attempted"], to_el["valid"], to_el["flipped"]) == (2, 2, 1)
        assert to_el["sf_raw"]["rate"] == pytest.approx(0.5) and to_el["sf_raw"]["ci95"][0] < 0.5
        to_inel = rows["verdict-scripted to_ineligible"]
        assert (to_inel["attempted"], to_inel["valid"], to_inel["flipped"]) == (2, 2, 0)
        m = rows["llmmatch-scripted to_eligible"]
        # the rejected rewrite is left out of the denominator and counted with its reason
        assert (m["attempted"], m["valid"], m["flipped"]) == (3, 2, 1)
        assert m["rejected"] == {"changes another eligibility fact": 1}
        assert "llmmatch-scripted to_ineligible" not in rows  # no stated reasons for an eligible verdict
        recs = [json.loads(x) for x in (out.run_dir / "counterfactual.jsonl").read_text().splitlines()]
        miss = next(
            r for r in recs if r["backend"] == "verdict-scripted" and r["pair_id"] == "P3__NCT-CKD-02"
        )
        assert miss["status"] == "not_flipped" and miss["decision_after"] == "ineligible"
        report = (out.run_dir / "report.md").read_text()
        assert "## End-to-end counterfactual self-faithfulness" in report and "## Ranking" in report
        assert (
            s["ranking"]["backends"]["verdict-scripted"]["topics"] == 3
        )  # score-0 pairs ranked, not rewritten
        assert "Machinery check" in report and "84.3%" not in report
        assert "CF-FLIP" not in report and "CF-FLIP" not in (out.run_dir / "run.log").read_text()
        cmp = subprocess.run(
            [*VERDICT, "bench", "compare", str(out.run_dir), str(out.run_dir)], capture_output=True, text=True
        )
        assert cmp.returncode == 0 and cmp.stdout.count("| verdict-scripted | to_eligible | 2 | 2 |") == 2
        assert "Ranking (re-ranking" in cmp.stdout
        # rerun from the run's config.yaml, results discarded: every call from the cache
        calls = len(srv.requests)
        again = run(out.run_dir / "config.yaml", restart=True)
        assert again.paid_usd == 0 and len(srv.requests) == calls
        s2 = json.loads((again.run_dir / "results.json").read_text())
        assert s2["counterfactual"]["rows"] == rows | {
            k: {**v, "cost_usd": pytest.approx(v["cost_usd"])} for k, v in rows.items()
        }


def test_private_charts_never_go_to_a_remote_modifier(tmp_path):
    with ScriptedServer(cf_script()) as srv:
        cfg = cf_config(tmp_path, srv.url, modifier=scenario.endpoint("https://api.example.com/v1"))
        scenario.set_dataset(cfg, data_class="private")
        with pytest.raises(EgressRefused, match="api.example.com"):
            run(cfg)
        assert not srv.requests


def test_the_budget_stops_the_stage_and_a_rerun_resumes_it(tmp_path):
    with ScriptedServer(cf_script()) as srv:
        cfg = cf_config(tmp_path, srv.url, enabled=False)
        first = run(cfg)
        assert first.status == "complete" and first.paid_usd > 0
        data = yaml.safe_load(cfg.read_text())
        data["counterfactual"]["enabled"] = True
        data["budget_usd"] = first.paid_usd + 2.5 * scenario.CALL_USD  # room for two calls more
        cfg.write_text(yaml.safe_dump(data))
        stopped = run(cfg)
        assert stopped.status == "stopped_budget"
        cf_file = stopped.run_dir / "counterfactual.jsonl"
        kept = cf_file.read_text().splitlines() if cf_file.exists() else []
        assert len(kept) <= 1
        data["budget_usd"] = 1.0
        cfg.write_text(yaml.safe_dump(data))
        resumed = run(cfg)
        assert resumed.status == "complete"
        recs = cf_file.read_text().splitlines()
        assert recs[: len(kept)] == kept and len(recs) == 7  # 4 formal + 3 llm_match, none redone
