"""Ranking metrics: how each backend orders every topic's (patient's) judged trials.

The setting is **re-ranking the judged trials of each topic**, not retrieval from the whole
registry: every backend orders the same candidate list (the dataset's pairs of that patient, plus
the TREC score-0 pairs when `dataset.not_relevant: rank`), and the metrics compare that order with
the official graded judgments (2 eligible, 1 excluded, 0 not relevant; a dataset with binary labels
grades eligible 2 and ineligible 0).

How each backend orders a topic:
- formal backends (`formalizer`, `recorded`): as `verdict screen` does, with the one ranking of the
  project (`verdict.core.ranking.rerank`: tier, then distance, then complete before cut short, ties
  by trial id); a pair the backend failed on goes last (as undetermined); a recorded pair ranks
  where its best variant does;
- `llm_match`: by its own stated score (0-100, prompt v2), highest first; without a score (prompt
  v1), eligible verdicts first;
- any other backend: eligible decisions first;
- the lexical baseline: BM25 (bm25s, Lucene variant, English stopwords) of the patient note against
  each trial's criteria text, the index built over every trial of the run.

Ties are broken by trial id (the screen's rule). Because the tiers leave many ties, every metric is
also computed over `ranking.tie_orders` random orders of the tied trials (seeded), and the report
gives their mean and range. Metrics (trec_eval conventions): nDCG@10 with linear gains
rel / log2(rank + 1) against the ideal order of the topic's own judged trials; P@10 = eligible
trials in the top 10 / 10; recall@k = eligible trials in the top k / eligible trials of the topic.
A topic with a single candidate is left out (counted), one with no eligible trial is left out of
recall (and with no graded trial, of nDCG). The mean over topics has a percentile bootstrap 95% CI
over topics. With 10 or fewer candidates a topic's P@10 and recall@10 do not depend on the order.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import Field
from verdict.core.configs import StrictModel

from .protocol import PairResult, Placement

ELIGIBLE = 2
# Binary labels (SIGIR, a site's own) do not tell excluded from not relevant: ineligible gains nothing.
LABEL_GRADE = {"eligible": 2, "ineligible": 0}
METRICS = ("ndcg@10", "p@10", "recall@10", "recall@20")
SETTING = (
    "Setting: re-ranking each topic's judged trials (every trial judged for the patient, "
    "{what}), not retrieval from the whole registry."
)
# Published ranking figures (TREC Clinical Trials), shown beside the table with the setting above.
PEERS = [
    {
        "label": "TrialGPT (TREC 2021+2022 pooled, as TrialMatchAI reports it)",
        "ndcg@10": 0.728,
        "p@10": 0.669,
    },
    {"label": "TrialMatchAI (best reported configuration)", "ndcg@10": 0.785, "p@10": None},
]


class RankingConfig(StrictModel):
    enabled: bool = Field(True, description="compute the ranking metrics")
    tie_orders: int = Field(200, ge=0, le=10000, description="random orders of tied trials (spread)")
    bm25: bool = Field(True, description="the lexical BM25 baseline over the criteria text (bm25s)")


@dataclass(frozen=True)
class Ranked:
    """One judged trial of a topic as a backend placed it."""

    trial_id: str
    grade: int
    key: tuple  # the backend's order before tie-breaking: equal keys are ties


def grade_of(r) -> int:
    """The graded judgment of a pair or a result (a binary label graded 2 / 1)."""
    return r.grade if r.grade is not None else LABEL_GRADE[r.label]


# ---- the metrics of one ranked list ---------------------------------------------------------------
def dcg(grades: Sequence[int], k: int) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(grades[:k]))


def ndcg_at_k(grades: Sequence[int], k: int = 10) -> float | None:
    """nDCG@k of a ranked list of grades, the ideal being the same grades sorted; None if all 0."""
    ideal = dcg(sorted(grades, reverse=True), k)
    return dcg(grades, k) / ideal if ideal > 0 else None


def precision_at_k(grades: Sequence[int], k: int = 10) -> float:
    """Eligible trials in the top k, over k (trec_eval: a short list still divides by k)."""
    return sum(1 for g in grades[:k] if g >= ELIGIBLE) / k


def recall_at_k(grades: Sequence[int], k: int) -> float | None:
    total = sum(1 for g in grades if g >= ELIGIBLE)
    return sum(1 for g in grades[:k] if g >= ELIGIBLE) / total if total else None


def topic_metrics(grades: Sequence[int]) -> dict[str, float | None]:
    return {
        "ndcg@10": ndcg_at_k(grades, 10),
        "p@10": precision_at_k(grades, 10),
        "recall@10": recall_at_k(grades, 10),
        "recall@20": recall_at_k(grades, 20),
    }


# ---- orders ------------------------------------------------------------------------------------
def tie_groups(ranked: Sequence[Ranked]) -> list[list[Ranked]]:
    """Consecutive trials with the same key: the ties of an ordered list."""
    groups: list[list[Ranked]] = []
    for r in ranked:
        if groups and groups[-1][-1].key == r.key:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def by_key(items: Sequence[Ranked]) -> list[Ranked]:
    """Key order, ties by trial id."""
    return sorted(items, key=lambda r: (r.key, r.trial_id))


def screen_order(items: Sequence[tuple[str, str, Placement]]) -> list[Ranked]:
    """(patient, trial, placement) in `verdict screen`'s order: `verdict.core.ranking.rerank`."""
    from verdict.core.ranking import RankedRow, rerank

    rows = [
        RankedRow(
            rank=0,
            trial_id=t,
            patient_id=p,
            decision="eligible" if pl.tier.startswith("eligible") else "ineligible",
            tier=pl.tier,
            distance=pl.distance,
            complete=pl.complete,
            reason="",
        )
        for p, t, pl in items
    ]
    return [Ranked(r.trial_id, 0, (r.tier, r.distance, r.complete)) for r in rerank(rows)]


def best_placement(places: Sequence[Placement]) -> Placement | None:
    """The placement the screen ranks first (a recorded pair's best variant)."""
    if not places:
        return None
    first = screen_order([("", str(i), p) for i, p in enumerate(places)])[0]
    return places[int(first.trial_id)]


FAILED = Placement(tier="undetermined")


def backend_order(rs: Sequence[PairResult], ranks_by: str) -> list[Ranked]:
    """One topic's results of one backend, in its order (ties by trial id)."""
    grades = {r.trial_id: grade_of(r) for r in rs}
    if ranks_by == "screen":
        placed = screen_order([(r.patient_id, r.trial_id, r.placement or FAILED) for r in rs])
        return [Ranked(x.trial_id, grades[x.trial_id], x.key) for x in placed]
    if ranks_by == "stated score":
        keys = {r.trial_id: (-r.score if r.score is not None else math.inf,) for r in rs}
    else:
        keys = {r.trial_id: (0 if r.status == "decided" and r.decision == "eligible" else 1,) for r in rs}
    return by_key([Ranked(r.trial_id, grades[r.trial_id], keys[r.trial_id]) for r in rs])


def ranks_by(kind: str, rs: Sequence[PairResult]) -> str:
    if kind in ("formalizer", "recorded"):
        return "screen"
    if kind == "llm_match" and any(r.score is not None for r in rs):
        return "stated score"
    return "decision"


RANKS_BY_TEXT = {
    "screen": "the screen's order (tier, distance; `verdict.core.ranking`)",
    "stated score": "its own stated score (0-100)",
    "decision": "its decision (eligible first)",
    "bm25": "BM25 of the note against the criteria text",
}


# ---- summaries over topics -------------------------------------------------------------------------
def _mean(values: Sequence[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _means(per_topic: Sequence[dict]) -> dict[str, float | None]:
    return {m: _mean([t[m] for t in per_topic]) for m in METRICS}


def bootstrap_topics(per_topic: Sequence[dict], b: int, seed: int) -> dict[str, list[float] | None]:
    """Percentile bootstrap 95% CI of each metric's mean, resampling the topics it is defined on."""
    import numpy as np

    out: dict[str, list[float] | None] = {}
    for m in METRICS:
        vals = np.array([t[m] for t in per_topic if t[m] is not None], dtype=float)
        if not len(vals):
            out[m] = None
            continue
        means = vals[np.random.default_rng(seed).integers(0, len(vals), size=(b, len(vals)))].mean(axis=1)
        out[m] = [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]
    return out


def tie_spread(topics: Sequence[list[Ranked]], orders: int, seed: int) -> dict:
    """Each metric's mean over topics under `orders` random orders of the tied trials."""
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {m: [] for m in METRICS}
    groups = [tie_groups(t) for t in topics]
    for _ in range(orders):
        per_topic = []
        for gs in groups:
            grades = []
            for g in gs:
                gg = [r.grade for r in g]
                rng.shuffle(gg)
                grades += gg
            per_topic.append(topic_metrics(grades))
        for m, v in _means(per_topic).items():
            if v is not None:
                draws[m].append(v)
    return {
        m: {"mean": sum(v) / len(v), "min": min(v), "max": max(v)} if v else None for m, v in draws.items()
    }


def rank_summary(topics: dict[str, list[Ranked]], how: str, b: int, seed: int, tie_orders: int) -> dict:
    """Metrics over the topics with at least two candidates (one trial's order is no ranking)."""
    ordered = [topics[k] for k in sorted(topics) if len(topics[k]) >= 2]
    per_topic = [topic_metrics([r.grade for r in t]) for t in ordered]
    sizes = sorted(len(t) for t in ordered)
    return {
        "ranks_by": how,
        "topics": len(ordered),
        "single_candidate_topics": sum(1 for t in topics.values() if len(t) < 2),
        "pairs": sum(sizes),
        "median_candidates": sizes[len(sizes) // 2] if sizes else None,
        "eligible": sum(1 for t in ordered for r in t if r.grade >= ELIGIBLE),
        "tied_pairs": sum(len(g) for t in ordered for g in tie_groups(t) if len(g) > 1),
        "metrics": _means(per_topic),
        "ci95": bootstrap_topics(per_topic, b, seed),
        "tie_orders": tie_orders,
        "tie_spread": tie_spread(ordered, tie_orders, seed) if tie_orders and ordered else None,
    }


def backend_ranking(kind: str, rs: Sequence[PairResult], b: int, seed: int, tie_orders: int) -> dict | None:
    """A backend's ranking summary from its repeat-0 results (unavailable pairs left out)."""
    rs = [r for r in rs if r.repeat == 0 and r.status != "unavailable"]
    if not rs:
        return None
    how = ranks_by(kind, rs)
    by_topic: dict[str, list[PairResult]] = defaultdict(list)
    for r in rs:
        by_topic[r.patient_id].append(r)
    topics = {p: backend_order(x, how) for p, x in by_topic.items()}
    return rank_summary(topics, how, b, seed, tie_orders)


def bm25_ranking(dataset, b: int, seed: int, tie_orders: int) -> dict:
    """The lexical floor: BM25 of each note against the criteria text of its topic's trials."""
    try:
        import bm25s
    except ImportError:
        return {"error": "bm25s is not installed (pip install 'verdict-onsite[bench]')"}
    pairs = [
        p for p in dataset.all_pairs if p.trial_id in dataset.trials and p.patient_id in dataset.patients
    ]
    if not pairs:
        return {"error": "no pair has both texts"}
    trial_ids = sorted({p.trial_id for p in pairs})
    tok: Callable = lambda texts: bm25s.tokenize(  # noqa: E731
        texts, stopwords="en", return_ids=False, show_progress=False
    )
    index = bm25s.BM25()
    index.index(
        bm25s.tokenize(
            [dataset.trials[t].criteria_text() for t in trial_ids], stopwords="en", show_progress=False
        ),
        show_progress=False,
    )
    col = {t: i for i, t in enumerate(trial_ids)}
    by_topic: dict[str, list] = defaultdict(list)
    for p in pairs:
        by_topic[p.patient_id].append(p)
    topics = {}
    for pid, ps in by_topic.items():
        [query] = tok([dataset.patients[pid].text])
        scores = index.get_scores(query)
        topics[pid] = by_key(
            [Ranked(p.trial_id, grade_of(p), (-round(float(scores[col[p.trial_id]]), 6),)) for p in ps]
        )
    return rank_summary(topics, "bm25", b, seed, tie_orders)
