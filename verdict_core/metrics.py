"""The project's one definition of the numbers its reports share: percentiles, rates with Wilson
intervals, and the validity of formalizer outputs. `verdict train eval` and `verdict bench` both
report through these, so a name means the same in both reports.

- **Percentiles** (p50, p95, ...) interpolate linearly between order statistics (numpy's default
  ``linear`` method; R type 7): p95 of [1, 2, 3, 4] is 3.85. Nearest-rank would be 4.
- **A rate** is ``{"k", "n", "rate", "ci95"}``: k of n with its Wilson score 95% interval
  (appendix D.4); ``rate`` and ``ci95`` are None when n = 0.
- **Validity** of outputs, by the formalizer's rejection category of the *first* output
  (`verdict.data_gen.formalizer.checks.REASONS`): ``json_valid`` - it is one JSON value (not empty, not
  cut off at the token limit, parseable); ``schema_valid`` - it is JSON *and* validates as the
  stage's typed output model (the Pydantic models whose JSON Schemas `verdict schema` writes, the
  formalizer's "schema" check). Later checks (program, evidence, coverage, ...) do not affect either.

Pure functions, no LLM: every part may import this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# First-output categories that mean "no usable JSON" / "JSON, but not the output model".
NO_JSON = ("empty", "truncated", "json")
NOT_SCHEMA = "schema"


def percentile(xs: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear interpolation between order statistics; None for no values."""
    v = sorted(xs)
    if not v:
        return None
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def latency_summary(xs: Sequence[float]) -> dict:
    """n, p50, p95 and mean of latencies (in whatever unit they are given)."""
    return {
        "n": len(xs),
        "p50": percentile(xs, 50),
        "p95": percentile(xs, 95),
        "mean": sum(xs) / len(xs) if xs else None,
    }


def wilson_ci(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion k/n (None when n = 0)."""
    if n == 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> dict:
    """k of n as a rate with its Wilson 95% interval."""
    ci = wilson_ci(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci95": list(ci) if ci else None}


def output_validity(first_reasons: Sequence[str | None]) -> dict:
    """``json_valid`` and ``schema_valid`` rates of outputs, from the rejection category of each
    first output (None: it passed every check)."""
    n = len(first_reasons)
    no_json = sum(1 for r in first_reasons if r in NO_JSON)
    bad_schema = sum(1 for r in first_reasons if r == NOT_SCHEMA)
    return {"json_valid": rate(n - no_json, n), "schema_valid": rate(n - no_json - bad_schema, n)}


def format_rate(r: dict | None, digits: int = 3) -> str:
    """``0.950 [0.764, 0.991]`` (n/a for no rate)."""
    if not r or r.get("rate") is None:
        return "n/a"
    ci = r.get("ci95")
    return f"{r['rate']:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")
