"""Start, watch and stop vLLM's OpenAI-compatible server for the students.

The server runs in its own environment (its pins clash with the training stack), as a child
process in its own session and process group, so stopping it also stops the engine processes it
spawns, and with its own temporary folder (TMPDIR: vLLM's IPC sockets and caches), removed when it
stops. `start()` returns once `/v1/models` lists the base model and every adapter; if the process
dies first, the error carries the tail of its log. `supervise()` watches a running server: when the
leader dies (even by SIGKILL, which leaves the engine processes orphaned) it stops what is left of
the group, removes the temporary folder and reports how it ended. When the launcher itself dies
(even by SIGKILL), a parent-death signal and a reaper process stop the group and remove the folder
(`process_reaper`); a folder left by a launcher that is gone anyway is removed at the next start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel
from verdict.core.progress import Progress
from verdict.slurm.local_cluster import pid_alive

from ..errors import VLLMServerError
from ..preflight import check_vllm
from .config import VLLMConfig
from .process_reaper import Reaper, parent_death_signal

LOG_TAIL_LINES = 40
TMP_PREFIX = "verdict-vllm-"
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-")  # verdict-vllm-<launcher pid>-<random>


class ServerState(BaseModel):
    """What a detached server leaves behind so that `verdict serve stop` can find it."""

    pid: int
    base_url: str
    models: list[str]
    log_file: str
    tmp_dir: str | None = None


# Servers this process started, by base URL: the service's readiness says how a dead one ended.
_STARTED: dict[str, VLLMServer] = {}


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


def exit_note(base_url: str) -> str | None:
    """How a vLLM server this process started at ``base_url`` ended; None if it runs (or is not ours)."""
    server = _STARTED.get(base_url.rstrip("/"))
    if server is None or server.exit_code is None:
        return None
    return f"vLLM (pid {server.pid}, started by this service) {describe_exit(server.exit_code)}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class VLLMServer:
    """One vLLM server process. Use as a context manager, or start()/stop()."""

    def __init__(self, config: VLLMConfig):
        self.config = config
        self.port = config.port or free_port(config.host)
        self.log_path = (
            Path(config.log_file)
            if config.log_file
            else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        )
        self.process: subprocess.Popen | None = None
        self.reaper: Reaper | None = None
        self.tmp_dir: Path | None = None
        self.pid: int | None = None
        self.exit_code: int | None = None  # set once the leader is seen dead
        self._lock = threading.Lock()  # stop() and the supervisor thread

    # -- what is run -----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}/v1"

    def command(self) -> list[str]:
        c = self.config
        python = c.interpreter()
        cmd = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(Path(c.model).resolve()),
            "--served-model-name",
            c.served_model_name,
            "--host",
            c.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(c.max_model_len),
            "--dtype",
            c.dtype,
            "--seed",
            str(c.seed),
            "--structured-outputs-config",
            json.dumps(c.structured_outputs.model_dump()),
        ]
        if c.max_num_seqs:
            cmd += ["--max-num-seqs", str(c.max_num_seqs)]
        if c.adapters:
            # All adapters fit in one batch: parser and miner requests interleave under load.
            cmd += [
                "--enable-lora",
                "--max-lora-rank",
                str(c.lora_rank()),
                "--max-loras",
                str(len(c.adapters)),
                "--lora-modules",
                *(f"{name}={p}" for name, p in c.adapter_dirs().items()),
            ]
        if c.device == "cpu":
            cmd += ["--enforce-eager"]  # no CUDA graphs on CPU
        else:
            cmd += [
                "--gpu-memory-utilization",
                str(c.gpu_memory_utilization),
                "--tensor-parallel-size",
                str(c.tensor_parallel_size),
            ]
        return cmd + list(c.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        # The project's venv must not leak into vLLM's (different transformers pin).
        for var in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(var, None)
        if self.tmp_dir is not None:
            # Everything vLLM puts in the temp dir (IPC sockets, compile and grammar caches) lands here.
            env["TMPDIR"] = str(self.tmp_dir)
        if self.config.device == "cpu":
            env["VLLM_TARGET_DEVICE"] = "cpu"
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.config.cpu_kvcache_space_gib)
        return env

    def check_paths(self) -> None:
        """Every missing input in one error, with absolute paths; `device: gpu` needs CUDA."""

        check_vllm(self.config)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, wait: bool = True, detached: bool = False) -> VLLMServer:
        """Start the server. Unless ``detached`` (left running for `verdict serve stop`), it dies with
        this process: a parent-death signal, and a reaper that stops its group and removes its folder."""
        if self.process is not None:
            raise VLLMServerError("server already started")
        self.check_paths()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        remove_orphaned_tmp_dirs()
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
        self.exit_code = None
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,
                preexec_fn=None if detached else parent_death_signal(),
            )
            if not detached:
                self.reaper = Reaper(self.process.pid, self.tmp_dir)
        except BaseException:
            if self.process is not None:
                stop_process_group(self.process.pid, timeout_s=5.0, popen=self.process)
                self.process = None
            self._remove_tmp()
            raise
        finally:
            log.close()
        self.pid = self.process.pid
        _STARTED[self.base_url] = self
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def models(self, timeout: float = 2.0) -> list[str] | None:
        """Model ids `/v1/models` lists, or None when the server does not answer."""
        try:
            with urllib.request.urlopen(self.base_url + "/models", timeout=timeout) as r:
                return [m["id"] for m in json.load(r)["data"]]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    def wait_ready(self, timeout_s: float | None = None, progress: Progress | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.config.ready_timeout_s)
        wanted = set(self.config.model_names())
        start = time.monotonic()
        last_note = start
        while True:
            rc = self.process.poll() if self.process else None
            if rc is not None:
                raise VLLMServerError(
                    f"vLLM exited with code {rc} before it was ready; last lines of {self.log_path}:\n"
                    + log_tail(self.log_path)
                )
            listed = self.models()
            if listed is not None:
                missing = wanted - set(listed)
                if not missing:
                    return
                raise VLLMServerError(f"vLLM is up but does not list {sorted(missing)} (lists {listed})")
            if time.monotonic() > deadline:
                raise VLLMServerError(
                    f"vLLM not ready after {time.monotonic() - start:.0f} s; last lines of {self.log_path}:\n"
                    + log_tail(self.log_path)
                )
            if progress and time.monotonic() - last_note >= 10:
                last_note = time.monotonic()
                progress(f"waiting for vLLM ({last_note - start:.0f} s)")
            time.sleep(0.5)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL what is left after ``timeout_s``; remove the
        temporary folder."""
        with self._lock:
            if self.process is None:
                self._remove_tmp()
                self._release_reaper()
                return self.exit_code
            rc = stop_process_group(self.process.pid, timeout_s, popen=self.process)
            self.process = None
            self._remove_tmp()
            self._release_reaper()
            return rc

    def supervise(self, on_exit, interval_s: float = 0.5) -> threading.Thread:
        """Watch the leader from a daemon thread. When it dies on its own: stop the rest of its group
        (engine processes), remove the temporary folder, then call ``on_exit(message)`` once."""

        def watch():
            while True:
                with self._lock:
                    proc = self.process
                    rc = proc.poll() if proc is not None else None
                    if proc is None:
                        return  # stopped on purpose
                    if rc is not None:
                        self.exit_code = rc
                        stop_process_group(proc.pid, timeout_s=5.0, popen=proc)
                        self.process = None
                        self._remove_tmp()
                        break
                time.sleep(interval_s)
            on_exit(
                f"vLLM (pid {proc.pid}) {describe_exit(rc)}; stopped what was left of its process group "
                f"and removed its temporary files; formalizer calls go to the other servers, or answer "
                f"503 + Retry-After while none is left. "
                f"Last lines of {self.log_path}:\n{log_tail(self.log_path, 15)}"
            )

        t = threading.Thread(target=watch, name="vllm-supervisor", daemon=True)
        t.start()
        return t

    def _release_reaper(self) -> None:
        if self.reaper is not None:
            self.reaper.release()
            self.reaper = None

    def _remove_tmp(self) -> None:
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def state(self) -> ServerState:
        assert self.process is not None
        return ServerState(
            pid=self.process.pid,
            base_url=self.base_url,
            models=self.config.model_names(),
            log_file=str(self.log_path),
            tmp_dir=str(self.tmp_dir) if self.tmp_dir else None,
        )

    def __enter__(self) -> VLLMServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def remove_orphaned_tmp_dirs() -> list[Path]:
    """Remove the temporary folders of servers whose launcher is gone (one killed before its reaper
    could run); a live launcher's folder is left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        m = _TMP_NAME.match(folder.name)
        if m is None or not folder.is_dir() or pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def stop_process_group(
    pid: int, timeout_s: float = 30.0, popen: subprocess.Popen | None = None
) -> int | None:
    """Stop the process group led by ``pid`` (a server started with start_new_session): SIGTERM,
    wait until every member is gone (engine processes shut down after the API server), SIGKILL
    what is left after ``timeout_s`` and wait until it is gone. Works after the leader died too:
    the group lives on while any member does."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_alive(pid, popen):
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10  # a killed process takes a moment to go (freeing GBs of memory)
    while time.monotonic() < deadline and group_alive(pid, popen):
        time.sleep(0.1)
    if popen is not None:
        try:
            return popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None
    return None


def group_alive(pgid: int, popen: subprocess.Popen | None) -> bool:
    """Whether a process of the group `pgid` is left (`popen`: its leader, reaped first)."""
    if popen is not None:
        popen.poll()  # reap the leader, or it stays a zombie member of the group
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (children of someone else that has not reaped them yet) count as gone. Polled
    # while stopping: the scan of /proc ends at the first live member.
    return next(group_members(pgid), None) is not None


def group_members(pgid: int) -> Iterator[int]:
    """The pids of the group's processes that are not zombies (read from /proc), as they are found."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            yield int(stat.parent.name)
