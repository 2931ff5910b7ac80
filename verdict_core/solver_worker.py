"""A solver worker process of verdict.core.solver_pool: one SolverJob in, one SolverReply out.

The pool's fork server preloads this module, so a new worker is a fork of a process that has the
engine imported already (milliseconds, not the second a fresh interpreter takes). Importing it also
keeps those forks from re-running the parent's `__main__` script, which multiprocessing does for
every child it starts by default: for `verdict serve api` that is the whole service's imports,
about two seconds per worker. Only this pool's processes (named PROCESS_NAME-...) skip it.
"""

from __future__ import annotations

import ctypes
import os
import signal
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Literal

from pydantic import BaseModel

from .decision import Decision, Override
from .engine import Engine, FixedOverrides
from .errors import PatientError, PolicyError, ProgramError, VerdictError
from .patient import ResolvedPatient
from .program import TrialProgram

PROCESS_NAME = "verdict-solver"
ERRORS: dict[str, type[VerdictError]] = {
    c.__name__: c for c in (VerdictError, ProgramError, PatientError, PolicyError)
}


class SolverJob(BaseModel):
    """One job as it crosses to a worker."""

    kind: Literal["decide", "check"]
    program: TrialProgram
    patient: ResolvedPatient | None = None
    overrides: list[Override] | None = None  # a FixedOverrides arbiter's answer


class SolverReply(BaseModel):
    """A worker's answer: the decision (decide), nothing (a satisfiable check), or an error."""

    decision: Decision | None = None
    error: str | None = None  # a VerdictError class name, or "internal"
    summary: str = ""
    problems: list[str] = []


def serve_jobs(conn: Connection, timeout_ms: int, alternatives: int, nice: int) -> None:
    """A worker's loop, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it ends us
    _die_with_parent()
    if nice > 0:
        os.nice(nice)
    engine = Engine(timeout_ms=timeout_ms, alternatives=alternatives)
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        reply = answer(engine, raw)
        try:
            conn.send_bytes(reply.model_dump_json(by_alias=True).encode())
        except OSError:
            return


def answer(engine: Engine, raw: bytes) -> SolverReply:
    """One job on this process's engine."""
    try:
        job = SolverJob.model_validate_json(raw)
        if job.kind == "check":
            engine.check_satisfiable(job.program)
            return SolverReply()
        arbiter = FixedOverrides(tuple(job.overrides)) if job.overrides is not None else None
        return SolverReply(decision=engine.decide(job.program, job.patient, None, arbiter))
    except VerdictError as e:
        name = type(e).__name__ if type(e).__name__ in ERRORS else "VerdictError"
        return SolverReply(error=name, summary=e.summary, problems=e.problems)
    except Exception as e:  # noqa: BLE001 - a bug: reported by its type only, the worker lives on
        return SolverReply(error="internal", summary=type(e).__name__)


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when its parent, the fork server (which ends with the
    pool's process), ends: no solver outlives the service."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_prepare = spawn.prepare


def _prepare_without_main(data: dict) -> None:
    if str(data.get("name", "")).startswith(PROCESS_NAME):
        data = {k: v for k, v in data.items() if k not in ("init_main_from_path", "init_main_from_name")}
    _prepare(data)


spawn.prepare = _prepare_without_main
