"""The shared report numbers (verdict_core/metrics.py): one p95, one schema_valid, Wilson rates."""

import pytest
from verdict.core.metrics import format_rate, latency_summary, output_validity, percentile, rate, wilson_ci


def test_p95_interpolates_between_order_statistics():
    assert percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)  # nearest-rank would say 4
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([7.0], 95) == 7.0 and percentile([], 95) is None
    summary = latency_summary([10, 20, 30, 40])
    assert summary == {"n": 4, "p50": 25.0, "p95": pytest.approx(38.5), "mean": 25.0}


def test_rates_carry_wilson_intervals():
    r = rate(5, 10)
    assert (r["k"], r["n"], r["rate"]) == (5, 10, 0.5)
    assert r["ci95"] == [pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4)]
    assert rate(0, 0) == {"k": 0, "n": 0, "rate": None, "ci95": None}
    assert wilson_ci(10, 10)[1] == 1.0 and wilson_ci(0, 10)[0] == 0.0
    assert format_rate(r) == "0.500 [0.237, 0.763]" and format_rate(rate(0, 0)) == "n/a"


def test_validity_reads_the_first_outputs_rejection_category():
    # passed, cut off, not JSON, JSON but not the model, JSON and model but bad evidence
    v = output_validity([None, "truncated", "json", "schema", "evidence"])
    assert (v["json_valid"]["k"], v["schema_valid"]["k"], v["schema_valid"]["n"]) == (3, 2, 5)
