"""The benchmark's metrics: small pure functions over labels, predictions and counts.

Binary scores treat "eligible" as the positive class (paper §5.1: F1 and accuracy). Confidence
intervals are percentile bootstraps over pairs (B = 2000, seeded, as the paper's appendix D.5)
or Wilson intervals for proportions such as PivotalFlipRate (appendix D.4). Percentiles, rates,
Wilson intervals and the meaning of json_valid / schema_valid are the project's shared ones
(`verdict.core.metrics`, also used by `verdict train eval`). McNemar's test is the
exact two-sided binomial test on the discordant pairs (§5.3). Undefined ratios (0/0) are 0.0 for
precision/recall/F1, as scikit-learn's ``zero_division=0``, and None elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

# The shared definitions (one p95, one schema_valid, rates with Wilson intervals): re-exported here
# so the bench's scoring reads as one vocabulary.
from verdict.core.metrics import latency_summary, output_validity, percentile, rate, wilson_ci  # noqa: F401

BOOTSTRAP_B = 2000


@dataclass(frozen=True)
class Confusion:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def confusion(y_true: Sequence[bool], y_pred: Sequence[bool]) -> Confusion:
    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_true)} labels but {len(y_pred)} predictions")
    tp = sum(1 for t, p in zip(y_true, y_pred) if t and p)
    fp = sum(1 for t, p in zip(y_true, y_pred) if not t and p)
    fn = sum(1 for t, p in zip(y_true, y_pred) if t and not p)
    return Confusion(tp=tp, fp=fp, fn=fn, tn=len(y_true) - tp - fp - fn)


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def precision(c: Confusion) -> float:
    return _ratio(c.tp, c.tp + c.fp)


def recall(c: Confusion) -> float:
    return _ratio(c.tp, c.tp + c.fn)


def f1(c: Confusion) -> float:
    return _ratio(2 * c.tp, 2 * c.tp + c.fp + c.fn)


def accuracy(c: Confusion) -> float:
    return _ratio(c.tp + c.tn, c.n)


SCORES: dict[str, Callable[[Confusion], float]] = {
    "f1": f1,
    "precision": precision,
    "recall": recall,
    "accuracy": accuracy,
}


def bootstrap_ci(
    y_true: Sequence[bool], y_pred: Sequence[bool], b: int = BOOTSTRAP_B, seed: int = 0, level: float = 0.95
) -> dict[str, tuple[float, float] | None]:
    """Percentile bootstrap CIs of every score in SCORES: resample the pairs with replacement b
    times (one seeded generator, the same resamples for every score). None with no pairs."""
    n = len(y_true)
    if n == 0:
        return {k: None for k in SCORES}
    import numpy as np

    t = np.asarray(y_true, dtype=bool)
    p = np.asarray(y_pred, dtype=bool)
    idx = np.random.default_rng(seed).integers(0, n, size=(b, n))
    tt, pp = t[idx], p[idx]
    tp = (tt & pp).sum(axis=1)
    fp = (~tt & pp).sum(axis=1)
    fn = (tt & ~pp).sum(axis=1)
    tn = n - tp - fp - fn

    def div(a, d):
        return np.divide(a, d, out=np.zeros(b, dtype=float), where=d > 0)

    samples = {
        "f1": div(2 * tp, 2 * tp + fp + fn),
        "precision": div(tp, tp + fp),
        "recall": div(tp, tp + fn),
        "accuracy": (tp + tn) / n,
    }
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    return {k: (float(np.quantile(v, lo_q)), float(np.quantile(v, hi_q))) for k, v in samples.items()}


def binary_scores(
    y_true: Sequence[bool], y_pred: Sequence[bool], b: int = BOOTSTRAP_B, seed: int = 0
) -> dict:
    """Confusion counts, F1/precision/recall/accuracy and their bootstrap 95% CIs."""
    c = confusion(y_true, y_pred)
    cis = bootstrap_ci(y_true, y_pred, b=b, seed=seed)
    out: dict = {"n": c.n, "confusion": c.as_dict(), "bootstrap": {"b": b, "seed": seed}}
    for name, fn in SCORES.items():
        ci = cis[name]
        out[name] = {"value": fn(c) if c.n else None, "ci95": list(ci) if ci else None}
    return out


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs: 2 * P(X <= min(b, c)) with
    X ~ Binomial(b + c, 1/2), capped at 1 (1.0 when there is no discordant pair)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def agreement(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """How two systems' binary decisions on the same pairs agree: the 2x2 table, the agreement
    rate, Cohen's kappa and McNemar's exact test on the discordant cells."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} and {len(b)} decisions: not the same pairs")
    both = sum(1 for x, y in zip(a, b) if x and y)
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    neither = len(a) - both - a_only - b_only
    n = len(a)
    rate = (both + neither) / n if n else None
    kappa = None
    if n:
        pa, pb = (both + a_only) / n, (both + b_only) / n
        expected = pa * pb + (1 - pa) * (1 - pb)
        kappa = (rate - expected) / (1 - expected) if expected < 1 else 1.0
    return {
        "n": n,
        "both": both,
        "a_only": a_only,
        "b_only": b_only,
        "neither": neither,
        "rate": rate,
        "kappa": kappa,
        "mcnemar_p": mcnemar_exact(a_only, b_only),
    }


def validity(first_reasons: Sequence[str | None], final_ok: Sequence[bool]) -> dict:
    """JSON and schema validity of one stage's outputs. ``first_reasons`` holds the rejection
    category of each first attempt (None = it passed every check): "json", "empty" and "truncated"
    mean no parseable JSON; "schema" means JSON that does not fit the schema; anything later
    (program, evidence, coverage, ...) is valid JSON and schema. ``final_ok``: accepted after the
    one repair."""
    n = len(first_reasons)
    return {
        "n": n,
        **output_validity(first_reasons),
        "valid_first_try": rate(sum(1 for r in first_reasons if r is None), n),
        "accepted_after_repair": rate(sum(1 for ok in final_ok if ok), n),
    }


def consistency(decisions: dict[str, Sequence[str]]) -> dict:
    """Policy consistency across repeated runs: the share of pairs whose repeats all reached the
    same decision (pairs with fewer than two decided repeats are left out)."""
    groups = [list(v) for v in decisions.values() if len(v) >= 2]
    same = sum(1 for g in groups if len(set(g)) == 1)
    return rate(same, len(groups))
