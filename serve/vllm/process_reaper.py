"""Children that die with their launcher: a parent-death signal, and a reaper for what it misses.

A server child (vLLM) runs in its own session and process group. Two things tie it to the process
that launched it, so that a `kill -9` of the launcher leaves no engine process and no temp folder:

- `parent_death_signal()`: a `preexec_fn` that asks Linux (prctl PR_SET_PDEATHSIG) to send the child
  SIGTERM when its launcher dies. Linux sends it when the launching *thread* ends, so it is only set
  for a child started from the main thread; it reaches the child only, not the engine processes the
  child spawns.
- `Reaper`: a small watcher process (`python -m verdict.serve.vllm.process_reaper PGID TMP_DIR`) that
  blocks reading a pipe only the launcher holds open. When the launcher dies, the pipe ends; the
  reaper then stops the whole process group (SIGTERM, then SIGKILL) and removes the temp folder.
  The launcher closes the pipe itself after stopping the server on purpose.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
RELEASED = b"released"
GRACE_S = 10.0  # SIGTERM -> SIGKILL, as long as vLLM needs to stop its engine processes


def _set_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def parent_death_signal():
    """`preexec_fn` for a child that must die with this process, or None where that cannot work
    (not Linux; not the main thread, whose end alone would signal the child)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    return _set_pdeathsig


class Reaper:
    """The watcher process for one process group. `release()` ends it after a stop on purpose."""

    def __init__(self, pgid: int, tmp_dir: Path | None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "verdict.serve.vllm.process_reaper", str(pgid), str(tmp_dir or "")],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the launcher's group does not reach it
        )

    def release(self, timeout_s: float = 15.0) -> None:
        """The group was stopped on purpose: the reaper exits without signalling (its id may be reused)."""
        if self.process.stdin is not None:
            try:
                self.process.stdin.write(RELEASED)
                self.process.stdin.close()
            except OSError:  # the reaper is gone already
                pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM the group, SIGKILL it if members are left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> None:
    pgid, tmp_dir = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the launcher
    # read() returns when every writer (the launcher) has closed the pipe or died.
    if sys.stdin.buffer.read() != RELEASED:
        stop_group(pgid)
    if tmp_dir:
        shutil.rmtree(tmp_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
