"""Decide (paper §3.2 steps 2-6, appendix A.4-A.5): one Decision with d, γ, ρ, δ, L and conflicts.

    engine = Engine()                       # caches compiled programs (warm regime)
    decision = engine.decide(program, patient)

Order of work: facts vs definitions (extraction conflicts, optional arbiter) -> d -> side statuses
-> labels L -> eligible: ρ, δ_I, γ / ineligible: δ_E, γ. Every solver call is time-limited; a
limit on d gives ``undetermined`` with the reason, a limit on a later artifact is listed in
``Decision.incomplete`` and never guessed.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import z3

from .assumptions import classify
from .compile import CompiledProgram, compile_program
from .conflicts import find_conflicts
from .decision import Decision, ExtractionConflict, Override, Pivotal, Trace
from .errors import ProgramError
from .labels import label_criteria
from .patient import Resolution, ResolvedPatient, check_patient
from .pivotal import to_eligible, to_ineligible
from .policy import Policy, apply_policy
from .program import TrialProgram
from .session import Session, SolverLimit
from .settled import not_asked, unasked_note
from .trace import eligible_trace, ineligible_trace, side_statuses

UNKNOWN = "satisfiability unknown"  # a satisfiability problem that is the solver limit, not a proof

# An arbiter re-reads the chart for conflicting atoms and proposes overrides (appendix A.4).
Arbiter = Callable[[list[ExtractionConflict], TrialProgram, ResolvedPatient], list[Override]]


class Engine:
    def __init__(
        self, timeout_ms: int = 5000, alternatives: int = 2, enumeration_cap: int = 32, cache_size: int = 256
    ):
        self.timeout_ms = timeout_ms
        self.alternatives = alternatives
        self.enumeration_cap = max(enumeration_cap, alternatives + 1)
        self._cache: OrderedDict[str, CompiledProgram] = OrderedDict()
        self._cache_size = cache_size
        # All engines of a process share one Z3 context: creating one costs ~5 ms, and destroying
        # a context while Python still holds objects of it crashes z3. A context is not
        # thread-safe - releasing a term included - so every z3 object is made and used under
        # this lock, and released under it too (see Z3Lock); run worker processes for parallelism.
        self.ctx, self._lock = _shared_context()

    # -- programs ----------------------------------------------------------------------------------
    def compiled(self, program: TrialProgram) -> CompiledProgram:
        """The compiled program (cached). Hold it only while holding the engine's lock, or in a
        single-threaded process."""
        with self._lock:
            return self._compiled(program)

    def _compiled(self, program: TrialProgram) -> CompiledProgram:
        key = f"{program.content_hash or program.compute_hash()}@{self.timeout_ms}"
        cp = self._cache.get(key)
        if cp is not None:
            self._cache.move_to_end(key)
            return cp
        cp = compile_program(program, self.timeout_ms, ctx=self.ctx)
        self._cache[key] = cp
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return cp

    def forget_programs(self) -> None:
        """Drop every compiled program, so the next decision on each pays for compiling it again
        (the latency benchmark's cold figure)."""
        with self._lock:
            self._cache.clear()

    def check_satisfiable(self, program: TrialProgram) -> None:
        """Raise ProgramError if no patient could ever satisfy the program (or a cohort of it)."""
        with self._lock:
            problems = self._unsatisfiable(self._compiled(program))
        if problems:
            raise unsatisfiable(program, problems)

    def _unsatisfiable(self, cp: CompiledProgram) -> list[str]:
        s = _Budgeted(cp.solver, self.timeout_ms)  # one time limit for all these checks together
        problems = []
        r = s.check(cp.phi_guard)
        if r == z3.unsat:
            problems.append("no patient can satisfy the definitions and any cohort together")
        never = [cc for cc in cp.criteria if s.check(cc.pos) == z3.unsat]
        for cid in cp.cohort_ids:
            if s.check(cp.cohort_guard[cid]) == z3.unsat:
                alone = [cc.key for cc in never if cc.cohort == cid]
                joint = alone or _conflicting_criteria(s, [cc for cc in cp.criteria if cc.cohort == cid])
                what = "can never be met" if alone else "cannot all be met together"
                problems.append(
                    f"cohort '{cid}': criteria {', '.join(joint)} {what} (with the definitions)"
                    if joint
                    else f"cohort '{cid}': its criteria contradict each other or the definitions"
                )
        for cc in never:
            problems.append(f"criterion '{cc.key}': can never be met ({cc.side})")
        if r == z3.unknown:
            problems.append(unknown_within(self.timeout_ms, s.reason_unknown()))
        return problems

    def _admits_no_patient(self, cp: CompiledProgram) -> list[str]:
        """Why no patient at all can be eligible ([] if some can, or if the solver cannot say):
        asked only for ineligible decisions, once per compiled program."""
        return cp.settled(
            ("admits-no-patient",),
            lambda: self._unsatisfiable(cp) if cp.solver.check(cp.phi_guard) == z3.unsat else [],
        )

    # -- deciding ----------------------------------------------------------------------------------
    def decide(
        self,
        program: TrialProgram,
        patient: ResolvedPatient,
        policy: Policy | None = None,
        arbiter: Arbiter | None = None,
    ) -> Decision:
        check_patient(program, patient)
        if policy is not None:
            patient = apply_policy(program, patient, policy)
        with self._lock:
            return self._decide_compiled(self._compiled(program), program, patient, arbiter)

    def _decide_compiled(self, cp: CompiledProgram, program, patient, arbiter) -> Decision:
        # A helper frame, so that its reference to cp (and the session's objects) is dropped
        # before decide() releases the lock.
        cp.solver.push()
        try:
            return self._decide(cp, program, patient, arbiter)
        finally:
            cp.solver.pop()

    def _decide(
        self, cp: CompiledProgram, program: TrialProgram, patient: ResolvedPatient, arbiter
    ) -> Decision:
        base = {**decision_base(program, patient), "program_hash": cp.content_hash}
        sess = Session(cp, patient.resolutions, self.timeout_ms)
        try:
            conflicts, overrides = self.consistent_facts(sess, program, patient, arbiter)
            eligible = sess.check(cp.phi_guard, *sess.lits())
            witness = sess.model(admitting=True) if eligible else None
        except SolverLimit as e:
            return undetermined(base, str(e))
        decision = Decision(
            **base,
            decision="eligible" if eligible else "ineligible",
            conflicts=conflicts,
            overrides=overrides,
            trace=Trace(summary=""),
        )
        incomplete: list[str] = []
        nobody = [] if eligible else self._admits_no_patient(cp)
        if nobody:  # no patient can be eligible: a property of the trial program, not of this chart
            decision.reason = "the trial program admits no patient: " + "; ".join(nobody)
            decision.pivotal = Pivotal(
                direction="to_eligible",
                note="no change of the patient's facts makes anyone "
                "eligible: the trial program admits no patient (review the program)",
            )

        def attempt(name, fn, default):
            try:
                return fn()
            except SolverLimit as e:
                incomplete.append(f"{name}: {e}")
                return default

        sides = attempt("cohorts", lambda: side_statuses(sess), [])
        labels, support = attempt("labels", lambda: label_criteria(sess), ([], {}))
        decision.cohorts, decision.labels = sides, labels
        if eligible:
            assumptions, forced = attempt("assumptions", lambda: classify(sess, witness, labels), ([], {}))
            decision.assumptions = assumptions
            decision.pivotal = attempt(
                "pivotal",
                lambda: to_ineligible(sess, forced, witness, sides, self.alternatives, self.enumeration_cap),
                None,
            )
            if labels:
                decision.trace = eligible_trace(sess, sides, labels, support, assumptions)
        else:
            if not nobody:
                decision.pivotal = attempt(
                    "pivotal",
                    lambda: to_eligible(sess, labels, self.alternatives, self.enumeration_cap),
                    None,
                )
            if labels:
                decision.trace = attempt(
                    "trace", lambda: ineligible_trace(sess, labels, support), decision.trace
                )
        unasked = not_asked(patient)
        if unasked and decision.pivotal is not None:  # δ_E takes unasked atoms as free: say so
            note = unasked_note(unasked)
            decision.pivotal.note = f"{decision.pivotal.note}; {note}" if decision.pivotal.note else note
        if not decision.trace.summary:
            decision.trace = Trace(summary=f"{decision.decision} (trace incomplete: solver limit)")
        decision.incomplete = incomplete
        return decision

    def consistent_facts(self, sess: Session, program, patient, arbiter):
        """A step of `decide` (public for benchmarks/core latency, which times it alone): check the
        facts against the definitions and set aside what conflicts (after the arbiter)."""
        if sess.check(*sess.lits()):
            sess.model()
            return [], []
        conflicts, aside = find_conflicts(sess)
        overrides: list[Override] = []
        if arbiter is not None and conflicts:
            overrides = list(arbiter(conflicts, program, patient))
            if overrides:
                rs = apply_overrides(patient, overrides).resolutions
                sess.set_facts(Session(sess.cp, rs, sess.timeout_ms).facts)
                if sess.check(*sess.lits()):
                    sess.model()
                    return conflicts, overrides
                conflicts, aside = find_conflicts(sess)
        sess.set_facts([f for f in sess.facts if f.atom not in aside])
        if not sess.check(*sess.lits()):
            raise SolverLimit("facts still contradict the definitions after setting conflicts aside")
        sess.model()
        return conflicts, overrides


def unsatisfiable(program: TrialProgram, problems: list[str]) -> ProgramError:
    """The error of a satisfiability check that found problems, or could not finish: when nothing
    was proven (every problem is the solver limit) it says so, never "cannot be satisfied"."""
    if all(p.startswith(UNKNOWN) for p in problems):
        return ProgramError(
            f"satisfiability of trial program '{program.trial_id}' is unknown within the solver limit: "
            "not accepted; simplify the criteria or raise the limit",
            problems,
        )
    return ProgramError(f"trial program '{program.trial_id}' cannot be satisfied", problems)


def unknown_within(timeout_ms: int, why: str) -> str:
    """The problem a satisfiability check names when its solver limit ran out."""
    return f"{UNKNOWN} within {timeout_ms} ms ({why})"


def undetermined(base: dict, why: str) -> Decision:
    """The decision when the solver limit ran out while deciding d (``base``: the decision's
    identifying fields, as `decision_base` gives them)."""
    return Decision(
        **base,
        decision="undetermined",
        reason=f"solver limit while deciding: {why}",
        trace=Trace(summary="undetermined: the solver did not finish"),
    )


def decision_base(program: TrialProgram, patient: ResolvedPatient) -> dict:
    """The fields that identify a decision: trial, patient, program and patient hashes, policy."""
    return dict(
        trial_id=program.trial_id,
        patient_id=patient.patient_id,
        program_hash=program.content_hash or program.compute_hash(),
        patient_hash=patient.content_hash(),
        policy=patient.policy,
    )


@dataclass(frozen=True)
class FixedOverrides:
    """An arbiter whose answer is already known (a recorded or validated arbiter output): it
    proposes these overrides whatever the conflicts. Plain data, so a decision with it can be
    made in another process (verdict.core.solver_pool)."""

    overrides: tuple[Override, ...]

    def __call__(self, *_args) -> list[Override]:
        return list(self.overrides)


def apply_overrides(patient: ResolvedPatient, overrides: list[Override]) -> ResolvedPatient:
    """The patient with an arbiter's overrides in place of its values (what `decide` does with them)."""
    by_atom = {o.atom: o for o in overrides}
    return patient.model_copy(
        update={"resolutions": [_overridden(r, by_atom.get(r.atom)) for r in patient.resolutions]}
    )


def _overridden(r: Resolution, o: Override | None) -> Resolution:
    if o is None:
        return r
    if o.value is None:
        return Resolution(atom=r.atom, status="unresolved", note=f"arbiter: {o.reason}")
    return Resolution(
        atom=r.atom,
        status="observed",
        value=o.value,
        evidence=r.evidence,
        note=f"arbiter override: {o.reason}",
    )


def _conflicting_criteria(s, criteria) -> list[str]:
    """A minimal set of criteria (keys) that cannot all be met with the definitions, by deletion
    in content order; [] if they can or the solver cannot say. ``s`` needs only ``check``."""
    if s.check(*[cc.pos for cc in criteria]) != z3.unsat:
        return []
    core = list(criteria)
    for cc in list(core):
        rest = [c for c in core if c is not cc]
        if s.check(*[c.pos for c in rest]) == z3.unsat:
            core = rest
    return [cc.key for cc in core]


class _Budgeted:
    """A solver whose checks share one time limit: once it is spent, a check answers unknown
    without running (a program of 40 hard criteria takes one limit, not 40)."""

    def __init__(self, solver: z3.Solver, limit_ms: int):
        self._solver, self._limit_ms = solver, limit_ms
        self._deadline = time.monotonic() + limit_ms / 1000

    def check(self, *assumptions):
        left = int((self._deadline - time.monotonic()) * 1000)
        if left <= 0:
            return z3.unknown
        if left >= self._limit_ms:
            return self._solver.check(*assumptions)
        self._solver.set("timeout", left)  # a compiled program's solver is shared: restore it
        try:
            return self._solver.check(*assumptions)
        finally:
            self._solver.set("timeout", self._limit_ms)

    def __getattr__(self, name: str):
        return getattr(self._solver, name)


class Z3Lock:
    """The lock of the shared Z3 context (re-entrant). A z3 object released by a thread that does
    not hold it - the garbage collector frees reference cycles in whichever thread it runs, the
    event loop's included - is not released then: its finalizer is queued and run by the next
    thread that takes the lock. So no thread ever waits for a solver call just to free memory."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pending: list[tuple[Callable, object]] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        ok = self._lock.acquire(blocking, timeout)
        if ok and self._pending:
            self._drain()
        return ok

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> Z3Lock:
        self.acquire()
        return self

    def __exit__(self, *_exc) -> None:
        self.release()

    def _drain(self) -> None:
        while self._pending:
            try:
                finalizer, obj = self._pending.pop()
            except IndexError:  # another thread took the last one
                return
            finalizer(obj)

    def finalize(self, finalizer: Callable, obj: object) -> None:
        """Run a z3 finalizer now if this thread holds or can take the lock at once, else later."""
        if self._lock._is_owned():
            finalizer(obj)
        elif self._lock.acquire(blocking=False):
            try:
                finalizer(obj)
                self._drain()
            finally:
                self._lock.release()
        else:
            self._pending.append((finalizer, obj))  # resurrected until then; freed once, later


_CONTEXT: tuple[z3.Context, Z3Lock] | None = None


def _shared_context() -> tuple[z3.Context, Z3Lock]:
    global _CONTEXT
    if _CONTEXT is None:
        ctx, lock = z3.Context(), Z3Lock()
        _CONTEXT = (ctx, lock)

        # A z3 context is not thread-safe, and that includes releasing its terms. Python frees an
        # object that sits in a reference cycle whenever the garbage collector runs, in whichever
        # thread triggered it - possibly while another thread is inside a solver call (servers
        # and benchmarks decide in worker threads). Waiting for the lock in the collector would
        # stall that thread (an event loop) for a whole solver call, so the finalizers of objects
        # of this context go through the lock instead (see Z3Lock.finalize).
        for cls in _finalized_classes():
            _route_finalizer(cls, ctx, lock)

        # At exit, leave the context to the OS instead of freeing it while module teardown still
        # releases terms of it (a crash, or a long hang): z3's finalizers skip a context whose
        # handle is gone, and a context it does not own is not deleted.
        @atexit.register
        def _forget() -> None:
            ctx.owner, ctx.ctx = False, None

    return _CONTEXT


def _finalized_classes() -> list[type]:
    """The z3 classes that define a finalizer releasing a z3 object (not the context itself)."""
    return [
        c
        for c in vars(z3.z3).values()
        if isinstance(c, type)
        and "__del__" in c.__dict__
        and c.__module__ == "z3.z3"
        and c not in (z3.Context, z3.UserPropagateBase)
    ]


def _route_finalizer(cls: type, ctx: z3.Context, lock: Z3Lock) -> None:
    original = cls.__dict__["__del__"]

    def __del__(self, _original=original):
        if getattr(self, "ctx", None) is ctx:
            lock.finalize(_original, self)
        else:  # another context (single-threaded callers): as before
            _original(self)

    cls.__del__ = __del__


_default_engine: Engine | None = None


def default_engine() -> Engine:
    """The process's default engine (the core's default limits), made on first use: what `decide` and
    `check_satisfiable` below use, and what a caller without an engine of its own should use."""
    global _default_engine
    if _default_engine is None:
        _default_engine = Engine()
    return _default_engine


def decide(
    program: TrialProgram,
    patient: ResolvedPatient,
    policy: Policy | None = None,
    arbiter: Arbiter | None = None,
) -> Decision:
    return default_engine().decide(program, patient, policy=policy, arbiter=arbiter)


def check_satisfiable(program: TrialProgram) -> None:
    default_engine().check_satisfiable(program)
