"""Screening order by formal distance (verdict.core.ranking), on real decisions of the real engine."""

import random

from verdict.core.engine import Engine
from verdict.core.ranking import rank, rerank

from .helpers import patient, program


def _decide(trial_id, inclusion, **values):
    prog = program(inclusion, trial_id=trial_id)
    return Engine().decide(prog, patient(prog, **values))


def test_tiers_in_order_with_reasons():
    ds = [
        _decide("T-miss2", [{"op": "and", "args": ["a", "b"]}], a=False, b=False),  # |δ_E| = 2
        _decide("T-eligible", ["a"], a=True, b=True, c=True),  # nothing to confirm
        _decide("T-miss1", ["a", "b"], a=True, b=False),  # |δ_E| = 1
        _decide("T-confirm", ["a", "b"], a=True),  # b open: eligible if b is confirmed (prescreen)
    ]
    rows = rank(ds)
    by = {r.trial_id: r for r in rows}
    assert [r.trial_id for r in rows][:2] == ["T-eligible", "T-confirm"]
    assert by["T-eligible"].tier == "eligible" and by["T-eligible"].reason == "eligible, nothing to confirm"
    assert by["T-confirm"].tier == "eligible_to_confirm" and "b" in by["T-confirm"].to_confirm
    assert by["T-miss1"].tier == "near_miss" and by["T-miss1"].distance == 1
    assert by["T-miss1"].would_be_eligible_if == ["b: False -> True"]
    assert by["T-miss2"].distance == 2 and by["T-miss1"].rank < by["T-miss2"].rank
    assert [r.rank for r in rows] == [1, 2, 3, 4]


def test_order_is_a_pure_function_of_the_decisions():
    ds = [_decide(f"T{i}", ["a", "b"], a=bool(i % 2), b=bool(i % 3)) for i in range(8)]
    first = [r.model_dump() for r in rank(ds)]
    for seed in range(5):
        random.Random(seed).shuffle(ds)
        assert [r.model_dump() for r in rank(ds)] == first
    ties = [r.trial_id for r in rank(ds) if r.tier == "eligible"]
    assert ties == sorted(ties)  # ties broken by trial id


def test_rows_ranked_one_at_a_time_rerank_to_the_order_of_all():
    """A screen ranks each decision as it finishes and keeps only its row: the rows, in any order,
    rerank to exactly what ranking all the decisions at once gives."""
    ds = [_decide(f"T{i}", ["a", "b"], a=bool(i % 2), b=bool(i % 3) or None) for i in range(9)]
    rows = [rank([d])[0] for d in ds]
    assert len({r.tier for r in rows}) == 3
    random.Random(0).shuffle(rows)
    assert [r.model_dump() for r in rerank(rows)] == [r.model_dump() for r in rank(ds)]


def test_one_reference_patient_against_its_recorded_trials():
    from verdict.core.ranking import _TIER_ORDER
    from verdict.core.reference import load_reference

    from tests.support import REFERENCE_V6, need

    need(REFERENCE_V6.is_dir(), "shared reference data")
    files = sorted((REFERENCE_V6 / "sigir-20141").glob("*__full.json"))
    engine = Engine()
    ds = []
    for f in files:
        case = load_reference(f)
        d = engine.decide(case.program, case.patient)
        ds.append(d.model_copy(update={"trial_id": f.name.split("__")[0]}))  # the variants share an NCT id
    rows = rank(ds)
    assert len(rows) == len(files) >= 6
    keys = [(_TIER_ORDER[r.tier], r.distance) for r in rows]
    assert keys == sorted(keys)
    for r, d in ((r, next(d for d in ds if d.trial_id == r.trial_id)) for r in rows):
        assert r.decision == d.decision
        if r.tier == "near_miss":
            assert r.distance == len(d.pivotal.conditions) and r.would_be_eligible_if
