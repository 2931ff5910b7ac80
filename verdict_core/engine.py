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
import gc
import threading
from collections import OrderedDict
from typing import Callable

import z3

from .compile import CompiledProgram, compile_program
from .conflicts import find_conflicts
from .decision import Decision, ExtractionConflict, Override, Trace
from .errors import ProgramError
from .labels import label_criteria
from .patient import Resolution, ResolvedPatient, check_patient
from .pivotal import to_eligible, to_ineligible
from .policy import Policy, apply_policy
from .program import TrialProgram
from .session import Session, SolverLimit
from .assumptions import classify
from .trace import eligible_trace, ineligible_trace, side_statuses

# An arbiter re-reads the chart for conflicting atoms and proposes overrides (appendix A.4).
Arbiter = Callable[[list[ExtractionConflict], TrialProgram, ResolvedPatient], list[Override]]


class Engine:
    def __init__(self, timeout_ms: int = 5000, alternatives: int = 2, enumeration_cap: int = 32, cache_size: int = 256):
        self.timeout_ms = timeout_ms
        self.alternatives = alternatives
        self.enumeration_cap = max(enumeration_cap, alternatives + 1)
        self._cache: OrderedDict[str, CompiledProgram] = OrderedDict()
        self._cache_size = cache_size
        # All engines of a process share one Z3 context: creating one costs ~5 ms, and destroying
        # a context while Python still holds objects of it crashes z3. A context is not
        # thread-safe - releasing a term included - so every z3 object is made, used and released
        # under this lock (see _shared_context); run worker processes for parallelism.
        self.ctx, self._lock = _shared_context()

    def __del__(self):
        lock = getattr(self, "_lock", None)
        if lock is not None:
            with lock:  # the compiled programs are released here, not in some other thread's call
                self._cache.clear()

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

    def check_satisfiable(self, program: TrialProgram) -> None:
        """Raise ProgramError if no patient could ever satisfy the program (or a cohort of it)."""
        with self._lock:
            problems = self._unsatisfiable(self._compiled(program))
        if problems:
            raise ProgramError(f"trial program '{program.trial_id}' cannot be satisfied", problems)

    def _unsatisfiable(self, cp: CompiledProgram) -> list[str]:
        s = cp.solver
        problems = []
        r = s.check(cp.phi_guard)
        if r == z3.unsat:
            problems.append("no patient can satisfy the definitions and any cohort together")
        for cid in cp.cohort_ids:
            if s.check(cp.cohort_guard[cid]) == z3.unsat:
                problems.append(f"cohort '{cid}': its criteria contradict each other or the definitions")
        for cc in cp.criteria:
            if s.check(cc.pos) == z3.unsat:
                problems.append(f"criterion '{cc.key}': can never be met ({cc.side})")
        if r == z3.unknown:
            problems.append(f"satisfiability unknown within {self.timeout_ms} ms ({s.reason_unknown()})")
        return problems

    # -- deciding ----------------------------------------------------------------------------------
    def decide(self, program: TrialProgram, patient: ResolvedPatient, policy: Policy | None = None,
               arbiter: Arbiter | None = None) -> Decision:
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

    def _decide(self, cp: CompiledProgram, program: TrialProgram, patient: ResolvedPatient, arbiter) -> Decision:
        base = dict(
            trial_id=program.trial_id, patient_id=patient.patient_id, program_hash=cp.content_hash,
            patient_hash=patient.content_hash(), policy=patient.policy,
        )
        sess = Session(cp, patient.resolutions, self.timeout_ms)
        try:
            conflicts, overrides = self._consistent_facts(sess, program, patient, arbiter)
            eligible = sess.check(cp.phi_guard, *sess.lits())
            witness = sess.model(admitting=True) if eligible else None
        except SolverLimit as e:
            return Decision(**base, decision="undetermined", reason=f"solver limit while deciding: {e}",
                            trace=Trace(summary="undetermined: the solver did not finish"))
        decision = Decision(**base, decision="eligible" if eligible else "ineligible", conflicts=conflicts,
                            overrides=overrides, trace=Trace(summary=""))
        incomplete: list[str] = []

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
            decision.pivotal = attempt("pivotal", lambda: to_ineligible(
                sess, forced, witness, sides, self.alternatives, self.enumeration_cap), None)
            if labels:
                decision.trace = eligible_trace(sess, sides, labels, support, assumptions)
        else:
            decision.pivotal = attempt("pivotal", lambda: to_eligible(sess, labels, self.alternatives, self.enumeration_cap), None)
            if labels:
                decision.trace = attempt("trace", lambda: ineligible_trace(sess, labels, support), decision.trace)
        if not decision.trace.summary:
            decision.trace = Trace(summary=f"{decision.decision} (trace incomplete: solver limit)")
        decision.incomplete = incomplete
        return decision

    def _consistent_facts(self, sess: Session, program, patient, arbiter):
        """Check facts against the definitions; set aside what conflicts (after the arbiter)."""
        if sess.check(*sess.lits()):
            sess.model()
            return [], []
        conflicts, aside = find_conflicts(sess)
        overrides: list[Override] = []
        if arbiter is not None and conflicts:
            overrides = list(arbiter(conflicts, program, patient))
            if overrides:
                by_atom = {o.atom: o for o in overrides}
                rs = [_overridden(r, by_atom.get(r.atom)) for r in patient.resolutions]
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


def _overridden(r: Resolution, o: Override | None) -> Resolution:
    if o is None:
        return r
    if o.value is None:
        return Resolution(atom=r.atom, status="unresolved", note=f"arbiter: {o.reason}")
    return Resolution(atom=r.atom, status="observed", value=o.value, evidence=r.evidence, note=f"arbiter override: {o.reason}")


_CONTEXT: tuple[z3.Context, threading.RLock] | None = None


def _shared_context() -> tuple[z3.Context, threading.RLock]:
    global _CONTEXT
    if _CONTEXT is None:
        ctx, lock = z3.Context(), threading.RLock()
        _CONTEXT = (ctx, lock)

        # A z3 context is not thread-safe, and that includes releasing its terms. Python frees an
        # object that sits in a reference cycle whenever the garbage collector runs, in whichever
        # thread triggered it - possibly while another thread is inside a solver call (servers
        # and benchmarks decide in worker threads). So a collection waits for the context.
        # (Nothing under the lock waits for another thread, so a collection waits at most for
        # one solver call sequence to finish.)
        held = threading.local()

        def gc_guard(phase: str, _info: dict) -> None:
            if phase == "start":
                lock.acquire()
                held.depth = getattr(held, "depth", 0) + 1
            elif getattr(held, "depth", 0):  # a guard added mid-collection never took the lock
                held.depth -= 1
                lock.release()

        gc.callbacks.append(gc_guard)

        # At exit, leave the context to the OS instead of freeing it while module teardown still
        # releases terms of it (a crash, or a long hang): z3's finalizers skip a context whose
        # handle is gone, and a context it does not own is not deleted.
        @atexit.register
        def _forget() -> None:
            if gc_guard in gc.callbacks:
                gc.callbacks.remove(gc_guard)
            ctx.owner, ctx.ctx = False, None
    return _CONTEXT


_default_engine: Engine | None = None


def _engine() -> Engine:
    global _default_engine
    if _default_engine is None:
        _default_engine = Engine()
    return _default_engine


def decide(program: TrialProgram, patient: ResolvedPatient, policy: Policy | None = None,
           arbiter: Arbiter | None = None) -> Decision:
    return _engine().decide(program, patient, policy=policy, arbiter=arbiter)


def check_satisfiable(program: TrialProgram) -> None:
    _engine().check_satisfiable(program)
