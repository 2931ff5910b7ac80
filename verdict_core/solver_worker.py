"""A solver worker process of verdict.core.solver_pool: one SolverJob in, one SolverReply out.

The pool's fork server preloads this module, so a new worker is a fork of a process that has the
engine imported already (milliseconds, not the second a fresh interpreter takes). Importing it also
keeps those forks from re-running the parent's `__main__` script, which multiprocessing does for
every child it starts by default: for `verdict serve api` that is the whole service's imports,
about two seconds per worker. Only this pool's processes (named PROCESS_NAME-...) skip it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import OrderedDict
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
_PROGRAMS_KEPT = 256
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


def serve_jobs(conn: Connection, lifeline: Connection, timeout_ms: int, alternatives: int, nice: int) -> None:
    """A worker's loop, until the pipe closes. `lifeline`: a pipe whose only writer is the pool's
    process, which never writes: it reads EOF when that process ends, however it ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it ends us
    threading.Thread(target=_exit_with, args=(lifeline,), daemon=True).start()
    if nice > 0:
        os.nice(nice)
    engine = Engine(timeout_ms=timeout_ms, alternatives=alternatives)
    programs: OrderedDict[str, TrialProgram] = OrderedDict()
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        reply = answer(engine, raw, programs)
        try:
            conn.send_bytes(reply.model_dump_json(by_alias=True).encode())
        except OSError:
            return


def answer(engine: Engine, raw: bytes, programs: OrderedDict[str, TrialProgram] | None = None) -> SolverReply:
    """One job on this process's engine. `programs`: the programs this worker has read, by content
    hash (validating a program again costs about as much as deciding a small one)."""
    try:
        job = _job(raw, programs if programs is not None else OrderedDict())
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


def _job(raw: bytes, programs: OrderedDict[str, TrialProgram]) -> SolverJob:
    data = json.loads(raw)
    key = data["program"].get("content_hash")
    program = programs.get(key) if key else None
    if program is None:
        program = TrialProgram.model_validate(data["program"])
        if key:
            programs[key] = program
            while len(programs) > _PROGRAMS_KEPT:
                programs.popitem(last=False)
    else:
        programs.move_to_end(key)
    return SolverJob.model_validate({**data, "program": program})


def _exit_with(lifeline: Connection) -> None:
    """End this process when the pool's process is gone, even in the middle of a solve (Z3 runs
    without the GIL): a killed service leaves no solver running."""
    try:
        lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(0)


_prepare = spawn.prepare


def _prepare_without_main(data: dict) -> None:
    if str(data.get("name", "")).startswith(PROCESS_NAME):
        data = {k: v for k, v in data.items() if k not in ("init_main_from_path", "init_main_from_name")}
    _prepare(data)


spawn.prepare = _prepare_without_main
