"""Submit rendered jobs with sbatch, chain them with --dependency, and wait for them.

    ids = submit_jobs([Job("a", a_sh), Job("b", b_sh, after=["a"])])   # the one chain submitter
    ids = submit_chain(scripts)          # {"train": "12", "eval": "13", "eval_report": "14"}
    states = wait_for(ids.values())      # {"12": "COMPLETED", ...}

Job states come from ``scontrol show job`` (works without slurmdbd; finished jobs stay visible
for MinJobAge seconds) and fall back to ``sacct`` where accounting exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from verdict.core.errors import VerdictError

from .render import ChainScripts

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "NEVER_RUNS",
}


class SubmitError(VerdictError):
    """sbatch or scontrol is missing or refused a job."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SubmitError(f"'{name}' not found: run this on a SLURM login node (or install slurm-client)")
    return path


def sbatch(script: str | Path, dependency: str | None = None, env: dict | None = None) -> str:
    """Submit one script; returns its job id."""
    cmd = [_tool("sbatch"), "--parsable"]
    if dependency:
        cmd.append(f"--dependency={dependency}")
    cmd.append(str(script))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    if out.returncode != 0:
        raise SubmitError(f"sbatch refused {Path(script).name}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"


@dataclass
class Job:
    """One script of a chain: it starts after the jobs named in `after` (submitted before it)."""

    name: str
    script: Path
    after: list[str] = field(default_factory=list)
    # afterok: only if they succeeded; afterany: whatever their end (a merge of what finished)
    when: str = "afterok"


def submit_jobs(jobs: list[Job], env: dict | None = None, after: str | None = None) -> dict[str, str]:
    """The project's one chain submitter: sbatch each job in order, each depending on the jobs it
    names; `after`: a job id that every job without dependencies of its own waits for. Returns
    name -> job id. (The renderer made the log folders.)"""
    ids: dict[str, str] = {}
    for j in jobs:
        missing = [a for a in j.after if a not in ids]
        if missing:
            raise SubmitError(f"job '{j.name}' depends on {', '.join(missing)}, not submitted before it")
        dep = (
            f"{j.when}:" + ":".join(ids[a] for a in j.after)
            if j.after
            else (f"afterok:{after}" if after else None)
        )
        ids[j.name] = sbatch(j.script, dep, env)
    return ids


def submit_chain(
    scripts: ChainScripts, only: str | None = None, after: str | None = None, env: dict | None = None
) -> dict[str, str]:
    """train -> eval (afterok) -> eval_report (afterok on the whole eval array). ``only='eval'``
    submits the evaluation alone (after job ``after`` if given)."""
    jobs = []
    if only in (None, "train"):
        jobs.append(Job("train", scripts.train))
    if only in (None, "eval"):
        jobs.append(Job("eval", scripts.eval, after=["train"] if only is None else []))
        if scripts.eval_report:
            jobs.append(Job("eval_report", scripts.eval_report, after=["eval"]))
    return submit_jobs(jobs, env, after)


def job_states(job_id: str, env: dict | None = None) -> list[str]:
    """States of a job, or of every task of an array job (empty if SLURM no longer knows it). A job
    whose dependency failed stays PENDING forever; it is reported as NEVER_RUNS."""
    out = subprocess.run(
        [_tool("scontrol"), "show", "job", "-o", str(job_id)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    states = []
    if out.returncode == 0:
        for line in out.stdout.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "JobState" in fields:
                never = fields["JobState"] == "PENDING" and fields.get("Reason") == "DependencyNeverSatisfied"
                states.append("NEVER_RUNS" if never else fields["JobState"])
    if not states and shutil.which("sacct"):
        acct = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "State", "-j", str(job_id)],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        states = [s.split()[0] for s in acct.stdout.split() if s.strip()] if acct.returncode == 0 else []
    return states


def overall(states: list[str]) -> str:
    if not states:
        return "UNKNOWN"
    if all(s in FINAL_STATES for s in states):
        bad = [s for s in states if s != "COMPLETED"]
        return bad[0] if bad else "COMPLETED"
    return "PENDING" if all(s == "PENDING" for s in states) else "RUNNING"


def wait_for(
    job_ids, timeout: float = 3600, poll: float = 2.0, env: dict | None = None, on_change=None
) -> dict[str, str]:
    """Wait until every job (all array tasks) has a final state; returns job id -> state."""
    ids = [str(j) for j in job_ids]
    last: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        now = {j: overall(job_states(j, env)) for j in ids}
        if on_change and now != last:
            on_change(now)
        last = now
        if all(s in FINAL_STATES for s in now.values()):
            return now
        if time.monotonic() > deadline:
            raise SubmitError(f"jobs still not finished after {timeout:.0f}s: {now}")
        time.sleep(poll)


def slurm_env(slurm_conf: str | None = None) -> dict:
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env
