"""verdict.bench.metrics on cases small enough to check by hand."""

import math

import pytest
from verdict.bench import metrics as M

T, F = True, False


def test_confusion_and_scores_by_hand():
    # labels:      E  E  E  I  I  I  I
    # predictions: E  E  I  E  I  I  I   -> TP 2, FN 1, FP 1, TN 3
    y = [T, T, T, F, F, F, F]
    p = [T, T, F, T, F, F, F]
    c = M.confusion(y, p)
    assert (c.tp, c.fp, c.fn, c.tn, c.n) == (2, 1, 1, 3, 7)
    assert M.precision(c) == pytest.approx(2 / 3)
    assert M.recall(c) == pytest.approx(2 / 3)
    assert M.f1(c) == pytest.approx(4 / 6)
    assert M.accuracy(c) == pytest.approx(5 / 7)


def test_undefined_ratios_are_zero_not_errors():
    c = M.confusion([F, F], [F, F])  # nothing eligible, nothing predicted
    assert (M.precision(c), M.recall(c), M.f1(c), M.accuracy(c)) == (0.0, 0.0, 0.0, 1.0)
    assert M.binary_scores([], [])["f1"] == {"value": None, "ci95": None}
    with pytest.raises(ValueError, match="2 labels but 1 predictions"):
        M.confusion([T, F], [T])


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    y = [T, F] * 20 + [T] * 10
    p = [T, F] * 15 + [F, T] * 5 + [T] * 10
    a = M.binary_scores(y, p, b=2000, seed=7)
    b = M.binary_scores(y, p, b=2000, seed=7)
    c = M.binary_scores(y, p, b=2000, seed=8)
    assert a == b  # same seed, same intervals
    assert a["f1"]["ci95"] != c["f1"]["ci95"]
    for k in ("f1", "precision", "recall", "accuracy"):
        lo, hi = a[k]["ci95"]
        assert lo < a[k]["value"] < hi
    assert a["bootstrap"] == {"b": 2000, "seed": 7}


def test_bootstrap_of_a_perfect_system_is_a_point():
    y = [T, F, T, F, T]
    s = M.binary_scores(y, y, b=500)
    assert s["f1"] == {"value": 1.0, "ci95": [1.0, 1.0]}
    assert s["accuracy"]["ci95"] == [1.0, 1.0]


def test_mcnemar_exact_by_hand():
    assert M.mcnemar_exact(0, 0) == 1.0
    assert M.mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 2 * (1/2)^5
    assert M.mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)  # 2 * (C(10,0)+C(10,1)) / 2^10
    assert M.mcnemar_exact(9, 1) == M.mcnemar_exact(1, 9)
    assert M.mcnemar_exact(3, 3) == 1.0  # capped


def test_agreement_table_kappa_and_mcnemar():
    a = [T, T, T, F, F, T]
    b = [T, F, F, F, F, T]
    g = M.agreement(a, b)
    assert (g["both"], g["a_only"], g["b_only"], g["neither"]) == (2, 2, 0, 2)
    assert g["rate"] == pytest.approx(4 / 6)
    # kappa: p_a = 4/6, p_b = 2/6; expected = 4/6*2/6 + 2/6*4/6 = 16/36; (24/36 - 16/36) / (20/36) = 0.4
    assert g["kappa"] == pytest.approx(0.4)
    assert g["mcnemar_p"] == pytest.approx(0.5)  # 2 * (1/2)^2


def test_percentiles_interpolate_like_numpy():
    xs = list(range(1, 11))
    assert M.percentile(xs, 50) == pytest.approx(5.5)
    assert M.percentile(xs, 95) == pytest.approx(9.55)
    assert M.percentile([3.0], 95) == 3.0 and M.percentile([], 50) is None
    s = M.latency_summary([10, 20, 30, 40])
    assert (s["n"], s["p50"], s["mean"]) == (4, 25.0, 25.0)


def test_wilson_interval():
    lo, hi = M.wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = M.wilson_ci(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert M.wilson_ci(0, 0) is None
    assert M.rate(3, 4)["rate"] == 0.75 and M.rate(0, 0)["rate"] is None


def test_validity_categories():
    # first attempts: ok, truncated JSON, schema error, evidence problem (valid JSON and schema), no JSON
    first = [None, "truncated", "schema", "evidence", "json"]
    final = [True, True, False, True, False]
    v = M.validity(first, final)
    assert v["n"] == 5
    assert v["json_valid"]["k"] == 3  # ok, schema, evidence
    assert v["schema_valid"]["k"] == 2  # ok, evidence
    assert v["valid_first_try"]["k"] == 1
    assert v["accepted_after_repair"]["k"] == 3


def test_consistency_across_repeats():
    c = M.consistency(
        {"p1": ["eligible", "eligible"], "p2": ["eligible", "ineligible"], "p3": ["ineligible"]}
    )
    assert (c["k"], c["n"]) == (1, 2)  # p3 has one decided repeat: left out
    assert math.isclose(c["rate"], 0.5)
