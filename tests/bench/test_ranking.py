"""Ranking metrics (bench/ranking.py): hand-computed small cases, ties, the screen's order, and a
`verdict bench run` on the scripted server that ranks the TREC-graded pairs (score 0 kept for the
ranking only), then `verdict bench compare`."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess

import pytest
from verdict.bench import ranking as R
from verdict.bench.bench_config import load_bench_config
from verdict.bench.protocol import Placement
from verdict.bench.runner import BenchRun
from verdict.data_gen.scripted_server import ScriptedServer

from tests.support import VERDICT

from . import scenario

IDEAL_P1 = 2 + 1 / math.log2(3)  # grades (2, 1, 0) in the best order


def test_ndcg_precision_recall_by_hand():
    assert R.ndcg_at_k([2, 0, 1]) == pytest.approx((2 + 0 + 1 / 2) / IDEAL_P1)
    assert R.ndcg_at_k([2, 1, 0]) == pytest.approx(1.0)
    assert R.ndcg_at_k([0, 0]) is None  # nothing to gain: left out of the mean
    assert R.ndcg_at_k([0, 2], k=1) == 0.0
    assert R.precision_at_k([2, 2, 0, 1]) == pytest.approx(0.2)  # trec_eval: a short list divides by 10
    assert R.precision_at_k([2, 1, 2], k=2) == pytest.approx(0.5)
    assert R.recall_at_k([0, 2, 1, 2], 1) == 0.0
    assert R.recall_at_k([0, 2, 1, 2], 2) == pytest.approx(0.5)
    assert R.recall_at_k([1, 0], 10) is None  # no eligible trial: left out
    grades = [2] * 12 + [0] * 3 + [2] * 8
    assert R.recall_at_k(grades, 10) == pytest.approx(10 / 20)
    assert R.recall_at_k(grades, 20) == pytest.approx(17 / 20)


def test_ties_are_broken_by_trial_id_and_their_spread_is_reported():
    topic = R.by_key([R.Ranked("NCT2", 2, (0,)), R.Ranked("NCT1", 0, (0,)), R.Ranked("NCT3", 1, (1,))])
    assert [r.trial_id for r in topic] == ["NCT1", "NCT2", "NCT3"]
    s = R.rank_summary({"p": topic}, "decision", b=200, seed=0, tie_orders=100)
    by_id = (0 + 2 / math.log2(3) + 1 / 2) / IDEAL_P1
    assert s["metrics"]["ndcg@10"] == pytest.approx(by_id)
    assert s["tied_pairs"] == 2
    sp = s["tie_spread"]["ndcg@10"]
    # the two orders of the tie: NCT1 first (by id), or NCT2 first: grades (2, 0, 1)
    other = (2 + 0 + 1 / 2) / IDEAL_P1
    assert sp["min"] == pytest.approx(by_id) and sp["max"] == pytest.approx(other)
    assert by_id < sp["mean"] < other
    assert s["tie_spread"]["p@10"]["min"] == s["tie_spread"]["p@10"]["max"] == pytest.approx(0.1)
    one = R.rank_summary({"p": topic, "q": [R.Ranked("NCT9", 2, (0,))]}, "decision", 200, 0, 0)
    assert one["topics"] == 1 and one["single_candidate_topics"] == 1  # one trial's order is no ranking


def test_bootstrap_over_topics_brackets_the_mean():
    topics = {f"p{i}": R.by_key([R.Ranked("a", i % 3, (0,)), R.Ranked("b", 2, (1,))]) for i in range(12)}
    s = R.rank_summary(topics, "decision", b=500, seed=0, tie_orders=0)
    lo, hi = s["ci95"]["ndcg@10"]
    assert lo <= s["metrics"]["ndcg@10"] <= hi and lo < hi
    assert s["tie_spread"] is None


def test_formal_backends_rank_as_the_screen_does():
    places = {
        "NCT-E": Placement(tier="eligible"),
        "NCT-C2": Placement(tier="eligible_to_confirm", distance=2),
        "NCT-C1": Placement(tier="eligible_to_confirm", distance=1),
        "NCT-N": Placement(tier="near_miss", distance=1),
        "NCT-NCUT": Placement(tier="near_miss", distance=1, complete=False),
        "NCT-I": Placement(tier="ineligible"),
        "NCT-U": Placement(tier="undetermined"),
    }
    order = R.screen_order([("p", t, pl) for t, pl in reversed(places.items())])
    assert [r.trial_id for r in order] == ["NCT-E", "NCT-C1", "NCT-C2", "NCT-N", "NCT-NCUT", "NCT-I", "NCT-U"]
    assert R.best_placement([places["NCT-N"], places["NCT-C2"], places["NCT-I"]]) == places["NCT-C2"]


# ---- end to end ------------------------------------------------------------------------------------
TREC = {  # scenario pairs with TREC grades; the score-0 ones are decided for the ranking only
    ("P1", "NCT-DM-01"): 2,
    ("P1", "NCT-CKD-02"): 1,
    ("P1", "NCT-BAD-03"): 0,
    ("P2", "NCT-DM-01"): 0,
    ("P2", "NCT-CKD-02"): 2,
    ("P3", "NCT-DM-01"): 1,
    ("P3", "NCT-CKD-02"): 0,
}


def test_bench_run_ranks_and_compare_shows_both(tmp_path):
    with ScriptedServer(scenario.script()) as srv:
        cfg = scenario.write_trec_config(tmp_path, srv.url, TREC, name="ranked")
        out = asyncio.run(
            BenchRun(load_bench_config(str(cfg)), progress_bar=False, progress=lambda m: None).run()
        )
    assert out.status == "complete" and out.done_now == 14
    s = json.loads((out.run_dir / "results.json").read_text())
    assert s["dataset"]["pairs"] == 4 and s["dataset"]["ranking_only_pairs"] == 3
    assert s["backends"]["llmmatch-scripted"]["coverage"]["scored"] == 4  # score 0: never a decision
    rk = s["ranking"]
    m = rk["backends"]["llmmatch-scripted"]
    # stated scores: P1 DM 90 (2), BAD 60 (0), CKD 20 (1); P2 CKD 30 (2), DM 10 (0); P3 DM 40 (1), CKD 5 (0)
    assert m["ranks_by"] == "stated score" and m["topics"] == 3 and m["pairs"] == 7
    assert m["metrics"]["ndcg@10"] == pytest.approx(((2 + 1 / 2) / IDEAL_P1 + 1 + 1) / 3)
    assert m["metrics"]["p@10"] == pytest.approx((0.1 + 0.1 + 0) / 3)
    assert m["metrics"]["recall@10"] == pytest.approx(1.0)  # P3 has no eligible trial: left out
    v = rk["backends"]["verdict-scripted"]
    assert v["ranks_by"] == "screen" and v["pairs"] == 7
    # the screen's order: P2's eligible CKD before its ineligible DM; P1's failed trial last
    assert v["metrics"]["recall@10"] == pytest.approx(1.0)
    assert rk["backends"]["bm25 (lexical baseline)"]["pairs"] == 7
    report = (out.run_dir / "report.md").read_text()
    assert "## Ranking" in report and "not retrieval from the whole registry" in report
    assert "Machinery check" in report and "0.728" not in report  # no peer figure beside a scripted run
    assert "## Decision accuracy" in report
    cmp = subprocess.run(
        [*VERDICT, "bench", "compare", str(out.run_dir), str(out.run_dir)], capture_output=True, text=True
    )
    assert cmp.returncode == 0, cmp.stderr
    assert "Ranking (re-ranking" in cmp.stdout and cmp.stdout.count("| stated score |") == 2
