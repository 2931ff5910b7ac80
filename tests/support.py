"""Shared test helpers: paths, `need()` for tests that use real services, the age atom of test programs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"  # the shared data folder beside the checkout (as in CI)
SHARED_DATA = SHARED / "data"
REFERENCE_V6 = SHARED_DATA / "reference" / "v6"
BENCHMARKS = SHARED_DATA / "benchmarks"
# The `verdict` command of this checkout, run as a subprocess (as a user runs it).
VERDICT = [sys.executable, "-m", "verdict"]


def need(ok: bool, why: str) -> None:
    """Skip when a real dependency (vLLM env, SLURM, Chromium, shared data) is missing locally;
    in CI (VERDICT_REQUIRE_ALL=1) a missing dependency is a failure, never a silent skip."""
    if ok:
        return
    if os.environ.get("VERDICT_REQUIRE_ALL") == "1":
        pytest.fail(f"required dependency missing: {why}")
    pytest.skip(why)


def run_together(*calls: Callable[[], object]) -> None:
    """Run every call in its own thread, all started before any is joined (concurrency tests)."""
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wait_until(condition: Callable[[], object], what: str, deadline_s: float = 60.0) -> None:
    """Poll until `condition()` holds: for state another process or thread produces after the event
    the test saw (a log line written after the response went out). The deadline only stops a broken
    test; it is no speed claim."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.05)


def run_verdict(*args: str, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """`verdict ARGS` from `cwd`, output captured as text, its exit code left to the caller."""
    return subprocess.run(
        [*VERDICT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )
