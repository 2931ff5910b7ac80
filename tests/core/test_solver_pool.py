"""The solver pool (verdict.core.solver_pool): decisions made in worker processes are the in-process
ones; a short decision completes while hard solves run; a solve past the time limit is ended and
its worker replaced; cancelled and crashed jobs leave no process behind. Real processes, real Z3;
asserted by order and by the pool's own counts, never by a clock."""

from __future__ import annotations

import asyncio
import glob
import itertools
import os
import signal
import time

import pytest
from verdict.core.cases import load_case
from verdict.core.engine import Engine, FixedOverrides
from verdict.core.errors import PatientError, ProgramError
from verdict.core.patient import MinedValue
from verdict.core.policy import load_policy, resolve
from verdict.core.program import TrialProgram, check_program
from verdict.core.solver_pool import SolverCrashed, SolverPool

from tests.serve.programs import cubes, fermat
from tests.serve.programs import program as small_program
from tests.support import REPO

POLICY = load_policy("prescreen")


def checked(data: dict) -> TrialProgram:
    return check_program(TrialProgram.model_validate(data))


def cases():
    return [load_case(f) for f in sorted(glob.glob(str(REPO / "examples/cases/*.json")))]


def trivial():
    case = cases()[0]
    return case.program, case.patient_under(POLICY)


def fermat_w(w: int):
    """The Fermat program with w observed, x, y, z open: w = 0 runs into any solver limit."""
    hard = checked(fermat("T-FERMAT"))
    return hard, resolve(hard, "P-F", [MinedValue(atom="w", value=w, evidence=f"w is {w}")], POLICY)


def wait_until(pool: SolverPool, ready, what: str):
    """Poll the pool's state (not a clock assertion: the deadline only stops a broken test)."""
    deadline = time.monotonic() + 60
    while not ready(pool.stats()):
        assert time.monotonic() < deadline, f"never: {what} ({pool.stats()})"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive either: its state in /proc is Z
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def pool():
    p = SolverPool(timeout_ms=1000, workers=2, hard_workers=2)
    yield p
    p.close()


def test_decisions_in_workers_are_the_in_process_ones(pool):
    engine = Engine(timeout_ms=1000)
    pairs = [(c.program, c.patient_under(POLICY)) for c in cases()]
    # a program over every combination of observed, imputed and open values
    small = checked(small_program("T-SMALL", "age_years"))
    for age, pain in itertools.product((None, 17, 18, 60), (None, True, False)):
        seen = [MinedValue(atom="age_years", value=age, evidence="age" if age is not None else "")]
        seen.append(
            MinedValue(atom="has_chest_pain", value=pain, evidence="pain" if pain is not None else "")
        )
        pairs.append((small, resolve(small, f"P-{age}-{pain}", seen, POLICY)))
    for program, patient in pairs:
        assert (
            pool.decide(program, patient).canonical_json() == engine.decide(program, patient).canonical_json()
        )
    # the arbiter's known answer crosses as data and is applied as in process
    program, patient = pairs[0]
    fix = FixedOverrides(tuple(engine.decide(program, patient).overrides))
    assert pool.decide(program, patient, None, fix) == engine.decide(program, patient, None, fix)
    # errors come back as the core's own
    with pytest.raises(ProgramError) as e:
        pool.check_satisfiable(checked(cubes("T-CUBES", 2)))
    assert "satisfiability unknown within 1000 ms" in str(e.value)
    other = checked(fermat("T-OTHER"))
    with pytest.raises(PatientError):
        pool.decide(other, pairs[0][1])
    with pytest.raises(TypeError, match="FixedOverrides"):
        pool.submit_decide(program, patient, None, lambda *_: [])


def test_a_short_decision_completes_while_hard_solves_run():
    pool = SolverPool(timeout_ms=120_000, workers=2, hard_workers=2)
    try:
        program, patient = trivial()
        pool.decide(program, patient)  # started
        hard = [pool.submit_check(checked(cubes(f"T-HARD-{i}", 1))) for i in range(4)]
        wait_until(
            pool, lambda s: s.short_busy + s.short_queued + s.hard_running + s.hard_queued == 4, "4 hard"
        )
        assert pool.decide(program, patient).decision == "eligible"
        assert not any(f.done() for f in hard)  # every hard solve still runs (or waits for the hard lane)
        s = pool.stats()
        assert s.hard_running == 2 and s.promoted == 2  # the hard lane is full ...
        assert s.short_busy + s.short_queued + s.hard_queued == 2  # ... and the rest are not done
        for f in hard:
            f.cancel()
        wait_until(pool, lambda s: s.cancelled == 4 and s.hard_running == s.hard_queued == 0, "all cancelled")
        assert len(pool.stats().pids) <= 2  # no hard-lane process left
    finally:
        pool.close()
    assert pool.stats().pids == ()


def only_worker(pool: SolverPool) -> int:
    """The pid of the pool's one idle worker, after a trivial decision: the next job's process."""
    program, patient = trivial()
    assert pool.decide(program, patient).decision == "eligible"
    (pid,) = pool.stats().pids
    return pid


def test_a_solve_past_the_time_limit_is_ended_and_its_worker_replaced():
    # Z3's own limit is far away (60 s): the pool's time limit ends the solve, as it does when Z3
    # does not honour its timeout.
    pool = SolverPool(timeout_ms=60_000, workers=1, time_limit_s=1.0)
    try:
        pid = only_worker(pool)
        program, patient = fermat_w(0)  # x^3 + y^3 = z^3: the solver cannot finish
        d = pool.decide(program, patient)
        assert d.decision == "undetermined"
        assert d.reason == "solver limit while deciding: the solve was stopped after 1 s"
        assert (d.trial_id, d.patient_id, d.patient_hash) == (program.trial_id, "P-F", patient.content_hash())
        assert not alive(pid)
        with pytest.raises(ProgramError) as e:
            pool.check_satisfiable(checked(cubes("T-CUBES", 1)))
        assert "satisfiability unknown within 60000 ms (the solve was stopped after 1 s)" in str(e.value)
        assert pool.stats().timed_out == 2 and pool.stats().crashed == 0
        fresh = only_worker(pool)  # a new process answers
        assert fresh != pid
    finally:
        pool.close()


def test_a_cancelled_solve_ends_its_process():
    pool = SolverPool(timeout_ms=60_000, workers=1)
    program, patient = fermat_w(0)

    async def cancel_one() -> None:
        task = asyncio.create_task(pool.adecide(program, patient))
        await asyncio.to_thread(wait_until, pool, lambda s: s.short_busy + s.hard_running == 1, "running")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        pid = only_worker(pool)
        asyncio.run(cancel_one())
        wait_until(pool, lambda s: s.cancelled == 1, "cancelled")
        assert not alive(pid)
        assert only_worker(pool) != pid
    finally:
        pool.close()


def test_a_crashed_worker_is_replaced_and_its_job_fails_clearly():
    pool = SolverPool(timeout_ms=60_000, workers=1)
    try:
        pid = only_worker(pool)
        program, patient = fermat_w(0)
        future = pool.submit_decide(program, patient)
        wait_until(pool, lambda s: s.short_busy + s.hard_running == 1, "running")
        os.kill(pid, signal.SIGKILL)  # out of memory, a crash in Z3: the process just ends
        with pytest.raises(SolverCrashed):
            future.result(timeout=60)
        assert only_worker(pool) != pid
        assert pool.stats().crashed == 1
    finally:
        pool.close()


def test_a_blocking_call_on_an_event_loop_is_refused(pool):
    program, patient = trivial()

    async def on_loop():
        with pytest.raises(RuntimeError, match="adecide"):
            pool.decide(program, patient)
        return await pool.adecide(program, patient)

    assert asyncio.run(on_loop()).decision == "eligible"
