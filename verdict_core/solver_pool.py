"""Solver work in worker processes, in two lanes, so a hard program never makes a short decision wait.

    pool = SolverPool(timeout_ms=5000, workers=4)
    decision = await pool.adecide(program, patient)       # from a coroutine
    decision = pool.decide(program, patient)              # from a thread: Engine's own signature
    await pool.acheck_satisfiable(program)                # raises ProgramError as Engine's does
    pool.close()

Each worker process runs the core's one entry, `Engine.decide` (or `Engine.check_satisfiable`), on
one job at a time: a Z3 context is not thread-safe (the engine's lock), so processes are what lets
a server decide on all its cores. Programs and patients cross the process boundary as their
pydantic models' JSON (`SolverJob`), decisions come back typed (`SolverReply`).

Lanes. Every job starts in the *short lane* (`workers` processes). A job still running after
`short_budget_s` leaves it: its process moves, job and all, to the *hard lane* (at most
`hard_workers` processes, at a lower CPU priority), and the short lane starts a fresh process in its
place (a fork of a preloaded server: milliseconds). So the short lane's processes are only ever
busy with jobs younger than the budget, and the work already done on a hard job is not lost. When
the hard lane is full the job's process is killed instead, and the job waits for a hard-lane slot
and starts again there. A program whose job outlived the budget is remembered for a while: its
next jobs go to the hard lane at once (queued ones of it too), unless a hard-lane run of it ends
within the budget.

Time limit. A job running `time_limit_s` (by default the engine's solver limit plus 3 s) is ended
by killing its process: Z3 does not always honour its own timeout. Its caller gets what the engine
answers when its limit runs out: an `undetermined` decision, or ProgramError "satisfiability
unknown". A cancelled job (the caller went away) frees its process the same way; a process that
dies is replaced and its job fails with SolverCrashed. One supervisor thread owns the processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from .decision import Decision
from .engine import FixedOverrides, decision_base, undetermined, unknown_within, unsatisfiable
from .patient import ResolvedPatient, check_patient
from .policy import Policy, apply_policy
from .program import TrialProgram
from .solver_worker import ERRORS, PROCESS_NAME, SolverJob, SolverReply, serve_jobs

_MEMO_SIZE = 1024  # programs remembered as hard
_EXTRA_S = 3.0  # default time limit beyond the engine's own solver limit


class SolverCrashed(RuntimeError):
    """The worker process ended without an answer (killed from outside, out of memory, a crash)."""


class SolverPoolClosed(RuntimeError):
    """The pool was closed before the job ended."""


@dataclass(frozen=True)
class PoolStats:
    """What the pool holds and has done (counters since it started)."""

    short_workers: int
    short_busy: int
    hard_running: int
    short_queued: int
    hard_queued: int
    answered: int  # jobs a worker answered
    promoted: int
    requeued: int
    timed_out: int
    cancelled: int
    crashed: int
    started: int  # worker processes started
    pids: tuple[int, ...]  # live worker processes


@dataclass(eq=False)
class _Job:
    kind: str
    payload: bytes
    key: str  # what the hardness memo remembers: kind and program hash
    program: TrialProgram
    patient: ResolvedPatient | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    started: float = 0.0  # when it started in its current process


@dataclass(eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    lane: str  # "short" | "hard"
    job: _Job | None = None


class SolverPool:
    """Worker processes deciding with their own Engine(timeout_ms, alternatives); see the module
    docstring. Thread-safe; start() is implicit on first use, close() ends every process."""

    def __init__(
        self,
        *,
        timeout_ms: int = 5000,
        alternatives: int = 2,
        workers: int | None = None,
        hard_workers: int | None = None,
        short_budget_s: float = 0.5,
        time_limit_s: float | None = None,
        hard_nice: int = 10,
    ):
        self.timeout_ms = timeout_ms
        self.alternatives = alternatives
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.hard_workers = max(1, hard_workers or self.workers)
        self.short_budget_s = short_budget_s
        self.time_limit_s = time_limit_s if time_limit_s is not None else timeout_ms / 1000 + _EXTRA_S
        self.hard_nice = hard_nice
        self._mp = multiprocessing.get_context("forkserver")
        self._lock = threading.Lock()
        self._inbox: deque[_Job] = deque()
        self._short_q: deque[_Job] = deque()
        self._hard_q: deque[_Job] = deque()
        self._all: list[_Worker] = []
        self._hard_keys: OrderedDict[str, None] = OrderedDict()
        self._counts = dict.fromkeys(
            ("answered", "promoted", "requeued", "timed_out", "cancelled", "crashed", "started"), 0
        )
        self._thread: threading.Thread | None = None
        self._closing = False
        self._wake_r, self._wake_w = -1, -1

    # -- the callers' side -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the supervisor and one short-lane process (the first start of the fork server,
        which preloads the engine, takes about a second)."""
        with self._lock:
            if self._thread is not None:
                return
            if self._closing:
                raise SolverPoolClosed("the solver pool is closed")
            _preload(self._mp)
            self._wake_r, self._wake_w = os.pipe()
            # Every worker holds the reading end; only this process the writing one (see serve_jobs).
            self._lifeline_r, self._lifeline_w = self._mp.Pipe(duplex=False)
            os.set_blocking(self._wake_w, False)
            self._thread = threading.Thread(target=self._run, name="solver-pool", daemon=True)
            self._thread.start()

    def submit_decide(
        self,
        program: TrialProgram,
        patient: ResolvedPatient,
        policy: Policy | None = None,
        arbiter: FixedOverrides | None = None,
    ) -> concurrent.futures.Future:
        """A future of `Engine.decide(program, patient, policy, arbiter)`, made in a worker."""
        if arbiter is not None and not isinstance(arbiter, FixedOverrides):
            raise TypeError("only a FixedOverrides arbiter can be used in a worker process")
        # As Engine.decide does: the patient is checked, then the policy applied (here, in the caller).
        patient = check_patient(program, patient)
        if policy is not None:
            patient = apply_policy(program, patient, policy)
        overrides = list(arbiter.overrides) if arbiter is not None else None
        job = SolverJob(kind="decide", program=program, patient=patient, overrides=overrides)
        return self._submit(job)

    def submit_check(self, program: TrialProgram) -> concurrent.futures.Future:
        """A future of `Engine.check_satisfiable(program)` (None, or ProgramError), made in a worker."""
        return self._submit(SolverJob(kind="check", program=program))

    def decide(self, program, patient, policy=None, arbiter=None) -> Decision:
        """`Engine.decide`, blocking: call it from a thread (never from an event loop)."""
        return _blocking(self.submit_decide(program, patient, policy, arbiter))

    def check_satisfiable(self, program: TrialProgram) -> None:
        """`Engine.check_satisfiable`, blocking: call it from a thread (never from an event loop)."""
        _blocking(self.submit_check(program))

    async def adecide(self, program, patient, policy=None, arbiter=None) -> Decision:
        """`Engine.decide` from a coroutine; cancelling it ends the job (and its process)."""
        return await asyncio.wrap_future(self.submit_decide(program, patient, policy, arbiter))

    async def acheck_satisfiable(self, program: TrialProgram) -> None:
        await asyncio.wrap_future(self.submit_check(program))

    def stats(self) -> PoolStats:
        with self._lock:
            busy = [w for w in self._all if w.job is not None]
            return PoolStats(
                short_workers=sum(w.lane == "short" for w in self._all),
                short_busy=sum(w.lane == "short" for w in busy),
                hard_running=sum(w.lane == "hard" for w in busy),
                short_queued=len(self._short_q) + len(self._inbox),
                hard_queued=len(self._hard_q),
                pids=tuple(w.process.pid for w in self._all if w.process.pid is not None),
                **self._counts,
            )

    def close(self) -> None:
        """End every worker process; jobs not finished fail with SolverPoolClosed."""
        with self._lock:
            self._closing = True
            thread = self._thread
        if thread is None:
            return
        self._wake()
        thread.join(timeout=30)

    def _submit(self, job_model: SolverJob) -> concurrent.futures.Future:
        program = job_model.program
        job = _Job(
            kind=job_model.kind,
            payload=job_model.model_dump_json(by_alias=True).encode(),
            key=f"{job_model.kind}:{program.content_hash or program.compute_hash()}",
            program=program,
            patient=job_model.patient,
        )
        self.start()
        with self._lock:
            if self._closing:
                raise SolverPoolClosed("the solver pool is closed")
            self._inbox.append(job)
        job.future.add_done_callback(self._on_done)
        self._wake()
        return job.future

    def _on_done(self, future: concurrent.futures.Future) -> None:
        if future.cancelled():  # the supervisor frees its process
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b".")
        except (BlockingIOError, OSError):  # already woken (a full pipe), or closed
            pass

    # -- the supervisor thread (the only one touching processes and queues) ----------------------
    def _run(self) -> None:
        try:
            # The fork server's first start (about a second) holds no lock: stats() never waits on it.
            from multiprocessing import forkserver

            forkserver.ensure_running()
            with self._lock:
                self._spawn("short")
            while True:
                with self._lock:
                    if self._closing:
                        break
                    self._step(time.monotonic())
                    busy = [w for w in self._all if w.job is not None]
                    watched = [
                        self._wake_r,
                        *(w.conn for w in busy),
                        *(w.process.sentinel for w in self._all),
                    ]
                    timeout = self._next_due(busy)
                ready = wait(watched, timeout)
                with self._lock:
                    if self._wake_r in ready:
                        os.read(self._wake_r, 4096)
                    for w in busy:
                        if w.conn in ready and w in self._all:
                            self._receive(w)
                    for w in list(self._all):
                        if w.process.sentinel in ready and w.job is not None:
                            self._lost(w, SolverCrashed("the solver worker process ended without an answer"))
                        elif w.process.sentinel in ready:
                            self._retire(w)
        finally:
            with self._lock:
                self._closing = True
                for w in list(self._all):
                    if w.job is not None:
                        _settle(w.job.future, exc=SolverPoolClosed("the solver pool is closed"))
                    self._retire(w)
                for job in (*self._inbox, *self._short_q, *self._hard_q):
                    _settle(job.future, exc=SolverPoolClosed("the solver pool is closed"))
                self._inbox.clear(), self._short_q.clear(), self._hard_q.clear()
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._lifeline_r.close()
                self._lifeline_w.close()

    def _step(self, now: float) -> None:
        while self._inbox:
            job = self._inbox.popleft()
            (self._hard_q if job.key in self._hard_keys else self._short_q).append(job)
        for q in (self._short_q, self._hard_q):  # a cancelled job that waits: just dropped
            for job in [j for j in q if j.future.cancelled()]:
                q.remove(job)
                self._counts["cancelled"] += 1
        for w in [w for w in self._all if w.job is not None]:
            job = w.job
            age = now - job.started
            if job.future.cancelled():
                self._counts["cancelled"] += 1
                self._retire(w)
            elif age >= self.time_limit_s:
                self._counts["timed_out"] += 1
                self._retire(w)
                _settle(job.future, *self._timed_out(job))
            elif age >= self.short_budget_s:
                self._remember_hard(job.key)
                if w.lane == "short":
                    self._leave_short_lane(w)
        self._dispatch(now)

    def _promote(self, w: _Worker) -> bool:
        """Move a busy short-lane process, job and all, to the hard lane if it has room."""
        if sum(x.lane == "hard" for x in self._all) >= self.hard_workers:
            return False
        w.lane = "hard"
        _renice(w.process.pid, self.hard_nice)
        self._counts["promoted"] += 1
        return True

    def _dispatch(self, now: float) -> None:
        for lane, q, size in (
            ("short", self._short_q, self.workers),
            ("hard", self._hard_q, self.hard_workers),
        ):
            while q:
                w = next((w for w in self._all if w.lane == lane and w.job is None), None)
                if w is None and sum(w.lane == lane for w in self._all) < size:
                    w = self._spawn(lane)
                if w is None:
                    break
                self._start_job(w, q.popleft(), now)
        for w in [w for w in self._all if w.lane == "hard" and w.job is None]:
            self._retire(w)  # a hard-lane process runs at a lower priority: never back to the short lane
        if not any(w.lane == "short" for w in self._all):
            self._spawn("short")  # one process kept ready

    def _start_job(self, w: _Worker, job: _Job, now: float) -> None:
        try:
            w.conn.send_bytes(job.payload)
        except OSError:  # the process is gone: the job waits for another
            (self._short_q if w.lane == "short" else self._hard_q).appendleft(job)
            self._retire(w)
            return
        w.job, job.started = job, now

    def _leave_short_lane(self, w: _Worker) -> None:
        """A job past the short budget: to the hard lane, or (the hard lane full) its process
        ended and the job queued for a hard-lane slot."""
        if not self._promote(w):
            self._counts["requeued"] += 1
            job = w.job
            self._retire(w)
            self._hard_q.append(job)

    def _receive(self, w: _Worker) -> None:
        job = w.job
        try:
            reply = SolverReply.model_validate_json(w.conn.recv_bytes())
        except (EOFError, OSError):
            self._lost(w, SolverCrashed("the solver worker process ended without an answer"))
            return
        w.job = None
        self._counts["answered"] += 1
        if w.lane == "hard" and time.monotonic() - job.started < self.short_budget_s:
            self._hard_keys.pop(job.key, None)  # quick this time: back to the short lane next time
        _settle(job.future, *_outcome(job, reply))

    def _lost(self, w: _Worker, exc: BaseException) -> None:
        self._counts["crashed"] += 1
        job = w.job
        self._retire(w)
        _settle(job.future, exc=exc)

    def _timed_out(self, job: _Job) -> tuple[object, BaseException | None]:
        why = f"the solve was stopped after {self.time_limit_s:g} s"
        if job.kind == "check":
            return None, unsatisfiable(job.program, [unknown_within(self.timeout_ms, why)])
        return undetermined(decision_base(job.program, job.patient), why), None

    def _remember_hard(self, key: str) -> None:
        """A program whose job outlived the budget: its next jobs (queued ones too) go to the hard lane."""
        if key in self._hard_keys:
            self._hard_keys.move_to_end(key)
            return
        self._hard_keys[key] = None
        while len(self._hard_keys) > _MEMO_SIZE:
            self._hard_keys.popitem(last=False)
        for job in [j for j in self._short_q if j.key == key]:
            self._short_q.remove(job)
            self._hard_q.append(job)

    def _next_due(self, busy: list[_Worker]) -> float | None:
        """Seconds until the next job reaches its time limit or the short budget; None if nothing runs."""
        now, due = time.monotonic(), []
        for w in busy:
            t0 = w.job.started
            due.append(t0 + self.time_limit_s)
            # A short-lane job past the budget is due at once (it may have passed since _step); a
            # hard-lane one only until then (when its program is remembered as hard).
            if w.lane == "short" or t0 + self.short_budget_s > now:
                due.append(t0 + self.short_budget_s)
        return max(0.0, min(due) - now) if due else None

    def _spawn(self, lane: str) -> _Worker:
        parent, child = self._mp.Pipe()
        nice = self.hard_nice if lane == "hard" else 0
        process = self._mp.Process(
            target=serve_jobs,
            args=(child, self._lifeline_r, self.timeout_ms, self.alternatives, nice),
            name=f"{PROCESS_NAME}-{lane}",
            daemon=True,
        )
        process.start()
        child.close()
        w = _Worker(process, parent, lane)
        self._all.append(w)
        self._counts["started"] += 1
        return w

    def _retire(self, w: _Worker) -> None:
        if w in self._all:
            self._all.remove(w)
        w.job = None
        w.conn.close()
        if w.process.is_alive():  # idle or not: nothing of it is kept
            w.process.kill()
        w.process.join(timeout=5)


def _outcome(job: _Job, reply: SolverReply) -> tuple[object, BaseException | None]:
    if reply.error is None:
        return (reply.decision if job.kind == "decide" else None), None
    cls = ERRORS.get(reply.error)
    if cls is None:  # a bug in the worker: its type only (messages can carry patient values)
        return None, RuntimeError(f"the solver worker failed: {reply.summary}")
    return None, cls(reply.summary, reply.problems)


def _settle(
    future: concurrent.futures.Future, result: object = None, exc: BaseException | None = None
) -> None:
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled meanwhile
        pass


def _blocking(future: concurrent.futures.Future):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return future.result()
    future.cancel()
    raise RuntimeError("a blocking solver call on an event loop: await adecide/acheck_satisfiable instead")


def _renice(pid: int | None, nice: int) -> None:
    if pid is None or nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + nice))
    except OSError:  # not permitted here: the lane still bounds the hard work
        pass


_preloaded = False


def _preload(mp) -> None:
    """The fork server imports the engine once; every worker is a fork of it (milliseconds)."""
    global _preloaded
    if not _preloaded:
        mp.set_forkserver_preload([serve_jobs.__module__])
        _preloaded = True
