"""`verdict bench core`: latency of the full artifact set (d, γ, ρ, δ, L) on the reference corpus.

Regimes, per patient-trial pair:
- cold: the pair's file is parsed, its program imported and compiled, then decided;
- warm: the program is already compiled (as when one trial is screened against many patients),
  so only the patient's work is paid;
- naive: the same artifacts with a fresh solver for every check and the program re-parsed and
  re-compiled for every artifact (the straightforward implementation), as the baseline.
Timings use one core (the process is pinned when the OS allows it).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import z3
from verdict.core.cases import load_case
from verdict.core.counterfactual import pivotal_flip_rate
from verdict.core.engine import Engine
from verdict.core.policy import Policy
from verdict.core.progress import Progress
from verdict.core.session import Session


@dataclass
class Stats:
    name: str
    ms: list[float]

    def q(self, p: float) -> float:
        xs = sorted(self.ms)
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    @property
    def median(self) -> float:
        return statistics.median(self.ms)

    def row(self) -> str:
        per_s = 1000 / statistics.mean(self.ms)
        return (
            f"{self.name:<6} n={len(self.ms):<4} median={self.median:7.2f}  p95={self.q(0.95):7.2f}  "
            f"p99={self.q(0.99):7.2f}  max={max(self.ms):7.2f} ms   {per_s:6.1f} pairs/s"
        )


def pin_one_core() -> str:
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        return "pinned to one core"
    except (AttributeError, OSError):
        return "not pinned (OS does not allow it)"


class NaiveSession(Session):
    """Every check builds a fresh solver from the program text plus this session's guards."""

    def __init__(self, cp, resolutions, timeout_ms):
        self._extra: list[z3.BoolRef] = []
        super().__init__(cp, resolutions, timeout_ms)

    def guard(self, expr, name="g"):
        g = z3.FreshBool(f"!{name}", self.ctx)
        self._extra.append(z3.Implies(g, expr))
        return g

    def _fresh(self) -> z3.Solver:
        s = z3.Solver(ctx=self.ctx)
        s.set("timeout", self.timeout_ms)
        s.from_string(self.cp.smt_text)
        s.add(self._extra)
        return s

    def check(self, *assumptions) -> bool:
        self.checks += 1
        self.s = self._fresh()
        return self._plain(assumptions)

    def _plain(self, assumptions) -> bool:
        r = self.s.check(*assumptions)
        if r == z3.unknown:
            from verdict.core.session import SolverLimit

            raise SolverLimit(self.s.reason_unknown())
        return r == z3.sat

    def consequences(self, assumptions, targets):
        self.s = self._fresh()
        return super().consequences(assumptions, targets)


def naive_decide(path: Path, policy: Policy, timeout_ms: int):
    """Re-import and re-compile the program for every artifact, fresh solver for every check."""
    from verdict.core import assumptions as A
    from verdict.core import labels as L
    from verdict.core import pivotal as P
    from verdict.core import trace as T

    aside: set[str] = set()

    def fresh():
        case = load_case(path)
        patient = case.patient_under(policy)
        eng = Engine(timeout_ms=timeout_ms)
        cp = eng.compiled(case.program)
        return (
            NaiveSession(cp, [r for r in patient.resolutions if r.atom not in aside], timeout_ms),
            eng,
            case,
            patient,
        )

    sess, eng, case, patient = fresh()
    eng.consistent_facts(sess, case.program, patient, None)  # conflicts set aside, as the engine does
    aside = {r.atom for r in patient.resolutions if r.resolved} - sess.fact_atoms
    eligible = sess.check(sess.cp.phi_guard, *sess.lits())
    witness = sess.s.model() if eligible else None
    if witness is not None:
        sess.admitting.append(witness)
        sess.models.append(witness)
    sess = fresh()[0]
    sides = T.side_statuses(sess)
    sess = fresh()[0]
    labels, support = L.label_criteria(sess)
    if eligible:
        sess = fresh()[0]
        sess.admitting.append(witness)
        sess.models.append(witness)
        assumptions, forced = A.classify(sess, witness, labels)
        sess = fresh()[0]
        P.to_ineligible(sess, forced, witness, sides, 2, 32)
        T.eligible_trace(fresh()[0], sides, labels, support, assumptions)
    else:
        sess = fresh()[0]
        P.to_eligible(sess, labels, 2, 32)
        sess = fresh()[0]
        T.ineligible_trace(sess, labels, support)


def run(
    directory: Path,
    policy: Policy,
    repeats: int = 3,
    naive: bool = True,
    timeout_ms: int = 5000,
    progress: Progress = print,
) -> dict:
    files = sorted(Path(directory).glob("*/*.json"))
    if not files:
        raise FileNotFoundError(f"no reference files (*/*.json) under {directory}")
    note = pin_one_core()
    progress(f"{len(files)} pairs from {directory}; {repeats} repeats; {note}")
    cold, warm, base = Stats("cold", []), Stats("warm", []), Stats("naive", [])
    engine = Engine(timeout_ms=timeout_ms)
    decided = []
    for i, path in enumerate(files):
        for _ in range(repeats):
            t0 = time.perf_counter()
            case = load_case(path)
            patient = case.patient_under(policy)
            engine.forget_programs()  # cold: this pair pays for parsing and compiling its program
            engine.decide(case.program, patient)
            cold.ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            engine.decide(case.program, patient)  # compiled program cached: the patient's work only
            warm.ms.append((time.perf_counter() - t0) * 1000)
        if naive:
            t0 = time.perf_counter()
            naive_decide(path, policy, timeout_ms)
            base.ms.append((time.perf_counter() - t0) * 1000)
        decided.append((path.parent.name + "/" + path.name, case.program, patient))
        if (i + 1) % 10 == 0 or i + 1 == len(files):
            progress(f"  {i + 1}/{len(files)} pairs")
    rates, _ = pivotal_flip_rate(engine, decided)
    result = {
        "pairs": len(files),
        "cold": cold,
        "warm": warm,
        "naive": base if naive else None,
        "flip_rates": rates,
    }
    return result


def report(result: dict) -> list[str]:
    lines = [s.row() for s in (result["cold"], result["warm"], result["naive"]) if s is not None]
    for r in result["flip_rates"]:
        rate = "n/a" if r.rate is None else f"{r.rate:.3f}"
        lines.append(f"PivotalFlipRate {r.direction}: {rate} ({r.flipped}/{r.cases})")
    cold, warm, naive = result["cold"], result["warm"], result["naive"]
    speedup = naive.median / cold.median if naive else float("nan")
    lines.append(
        f"core: cold_median_ms={cold.median:.2f} warm_median_ms={warm.median:.2f} "
        f"cold_p99_ms={cold.q(0.99):.2f} speedup_vs_naive={speedup:.1f}"
    )
    return lines
