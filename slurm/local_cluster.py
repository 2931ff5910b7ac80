"""A real one-node SLURM cluster in a folder, for CI, tests and trying the job scripts.

    cluster = LocalCluster("/tmp/vslurm").start()      # slurmctld + slurmd, auth none, 2 fake GPUs
    env = cluster.env()                                 # SLURM_CONF for sbatch/squeue/scontrol
    ...
    cluster.stop()                                      # by the PIDs recorded in <dir>/pids.json

Debian's Slurm 22.05 (``apt-get install -y slurmctld slurmd slurm-client``) with AuthType and
CredType none (no munge), state, spool, logs and PID files inside the folder, free ports, and GPU
GRES backed by character devices made with mknod (slurmd refuses plain files). Jobs that ask for
``--gres=gpu:1`` get CUDA_VISIBLE_DEVICES like on a real GPU node. Needs root (mknod, SlurmUser=root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from verdict.core.errors import VerdictError

DAEMONS = ("slurmctld", "slurmd")


class ClusterError(VerdictError):
    """The local cluster cannot start (Slurm missing, not root, daemons died)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 4096


class LocalCluster:
    def __init__(
        self,
        root: str | os.PathLike,
        cpus: int | None = None,
        memory_mb: int | None = None,
        gpus: int = 2,
        name: str = "verdict",
    ):
        self.root = Path(root).resolve()
        self.cpus = cpus or os.cpu_count() or 1
        self.memory_mb = memory_mb or max(1024, int(_memory_mb() * 0.8))
        self.gpus = gpus
        self.name = name
        self.conf = self.root / "slurm.conf"
        self.pid_file = self.root / "pids.json"

    # -- configuration -----------------------------------------------------------------------------
    def write_config(self) -> None:
        for sub in ("state", "spool", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        lines = [
            f"ClusterName={self.name}",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool",
            f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd.pid",
            f"SlurmctldLogFile={self.root}/log/slurmctld.log",
            f"SlurmdLogFile={self.root}/log/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=1000",  # without it one job takes all memory and jobs serialize
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=600",
            "KillWait=5",
            "Waittime=0",
        ]
        node = (
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} "
            "State=UNKNOWN"
        )
        if self.gpus:
            lines.append("GresTypes=gpu")
            node += f" Gres=gpu:{self.gpus}"
            self._make_gpu_devices()
            (self.root / "gres.conf").write_text(
                "AutoDetect=off\n"
                + "".join(
                    f"NodeName=localhost Name=gpu File={self.root}/dev/nvidia{i}\n" for i in range(self.gpus)
                )
            )
        lines += [node, "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP"]
        self.conf.write_text("\n".join(lines) + "\n")

    def _make_gpu_devices(self) -> None:
        for i in range(self.gpus):
            dev = self.root / "dev" / f"nvidia{i}"
            if not dev.exists():
                # character devices (here /dev/null's and /dev/zero's numbers): slurmd refuses plain files
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3 if i % 2 == 0 else 5))

    # -- lifecycle ---------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 90) -> LocalCluster:
        missing = [d for d in (*DAEMONS, "sbatch", "scontrol", "sinfo") if shutil.which(d) is None]
        if missing:
            raise ClusterError(
                f"not installed: {', '.join(missing)} (apt-get install -y slurmctld slurmd slurm-client)"
            )
        if os.geteuid() != 0:
            raise ClusterError(
                "the local cluster runs its daemons as root (SlurmUser=root, mknod'd GPU devices)"
            )
        if self.pid_file.exists() and self.running():
            return self
        self.write_config()
        pids = {}
        for daemon, args in (
            ("slurmctld", ["-D", "-f", str(self.conf)]),
            ("slurmd", ["-D", "-N", "localhost", "-f", str(self.conf)]),
        ):
            log = open(self.root / "log" / f"{daemon}.stdout", "ab")
            proc = subprocess.Popen(
                [shutil.which(daemon), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
            pids[daemon] = proc.pid
            self.pid_file.write_text(json.dumps(pids))
            if daemon == "slurmctld":
                self._wait(
                    lambda: self._ok(["scontrol", "ping"]) and "UP" in self._out(["scontrol", "ping"]),
                    timeout,
                    "slurmctld did not answer",
                )
        self._wait(self._node_ready, timeout, "the node did not become idle")
        return self

    def _ok(self, cmd: list[str]) -> bool:
        return subprocess.run(cmd, capture_output=True, env=self.env(), timeout=30).returncode == 0

    def _out(self, cmd: list[str]) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=30).stdout

    def _node_ready(self) -> bool:
        state = self._out(["sinfo", "-h", "-N", "-o", "%T"]).strip()
        return state.startswith(("idle", "mixed", "allocated"))

    def _wait(self, ok, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [d for d, pid in self.pids().items() if not _alive(pid)]
            if dead:
                self.stop()
                raise ClusterError(f"{', '.join(dead)} exited at start; see {self.root / 'log'}")
            if ok():
                return
            time.sleep(0.5)
        self.stop()
        raise ClusterError(f"{what} within {timeout:.0f}s; see {self.root / 'log'}")

    def pids(self) -> dict[str, int]:
        return json.loads(self.pid_file.read_text()) if self.pid_file.exists() else {}

    def running(self) -> bool:
        pids = self.pids()
        return bool(pids) and all(_alive(p) for p in pids.values())

    def stop(self, grace: float = 10) -> None:
        """Stop the daemons this cluster started, by their recorded PIDs (slurmd first)."""
        for daemon in reversed(DAEMONS):
            pid = self.pids().get(daemon)
            if pid is None or not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap our own children so they do not linger as zombies
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    return pid_alive(pid)
