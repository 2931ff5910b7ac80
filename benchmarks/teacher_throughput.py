"""Teacher-pipeline throughput against the scripted server (fixed per-call latency L, concurrency C).

    .venv/bin/python benchmarks/teacher_throughput.py [--latency 0.25] [--concurrency 16]
        [--trials 20] [--patients 20]

Runs a full teacher run (parser stage, then both value-miner passes per pair: every call goes through
the formalizer, the cache, the ledger and the checks) against a scripted server in its own process,
and prints requests/s next to the ideal C/L (the target is at least 0.8*C/L), then repeats the run
under a new name with the same cache and prints how many calls it sent (should be 0).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from verdict.data_gen.formalizer import EndpointConfig  # noqa: E402
from verdict.data_gen.runner import TeacherRun  # noqa: E402
from verdict.data_gen.teacher_config import RunConfig  # noqa: E402

from tests.data_gen.teacher_data import parser_script, write_inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.25, help="L: seconds per call at the server")
    ap.add_argument("--concurrency", type=int, default=16, help="C: teacher concurrency")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--patients", type=int, default=20)
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="teacher-bench-"))
    inputs = write_inputs(tmp, a.trials, a.patients)
    script = parser_script(a.trials, latency=a.latency)
    (tmp / "script.json").write_text(script.model_dump_json())
    log = tmp / "server.log"
    srv = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "verdict.data_gen.scripted_server",
            "--script",
            str(tmp / "script.json"),
            "--log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    url = srv.stdout.readline().split()[1]
    try:
        teacher = EndpointConfig(
            name="bench",
            base_url=url,
            model="m",
            concurrency=a.concurrency,
            timeout_s=30,
            prices={"input_per_million": 2.0, "output_per_million": 8.0},
        )

        def run(name: str):
            cfg = RunConfig.model_validate(
                {
                    "name": name,
                    "out_dir": str(tmp / "runs"),
                    "cache": str(tmp / "runs" / "cache.sqlite"),
                    "teachers": {"parser": "bench", "miner": "bench"},
                    "trials": {"path": str(inputs["trials"])},
                    "patients": {"path": str(inputs["patients"]), "data_class": "synthetic"},
                }
            )
            before = len(log.read_text().splitlines()) if log.exists() else 0
            t0 = time.perf_counter()
            summary = asyncio.run(TeacherRun(cfg, progress_bar=False, teachers={"bench": teacher}).run())
            wall = time.perf_counter() - t0
            lines = [json.loads(x) for x in log.read_text().splitlines()[before:]]
            return summary, wall, lines

        s, wall, lines = run("bench-1")
        ts = sorted(x["t"] for x in lines)
        # steady state: from the first to the last request start (excludes start-up and the tail)
        span = ts[-1] - ts[0] if len(ts) > 1 else wall
        rps = (len(ts) - 1) / span if span > 0 else float("nan")
        ideal = a.concurrency / a.latency
        print(
            f"L = {a.latency:g} s, C = {a.concurrency}: {len(lines)} requests "
            f"({s.accepted} accepted, {s.rejected} rejected records) in {wall:.2f} s wall"
        )
        print(
            f"throughput: {rps:.1f} requests/s steady state, {len(lines) / wall:.1f} requests/s over the "
            f"whole run; ideal C/L = {ideal:.1f}; ratio {rps / ideal:.2f} (target >= 0.80)"
        )
        s2, wall2, lines2 = run("bench-2")
        print(
            f"repeated run (new run name, same cache): {len(lines2)} calls sent, {s2.cache_hits} cache hits, "
            f"{wall2:.2f} s"
        )
        # CPU seconds the client (this process) and the server used: both share this machine's cores
        import resource

        me = resource.getrusage(resource.RUSAGE_SELF)
        with open(f"/proc/{srv.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        hz = __import__("os").sysconf("SC_CLK_TCK")
        print(
            f"cpu: client {me.ru_utime + me.ru_stime:.1f} s, scripted server "
            f"{(int(fields[11]) + int(fields[12])) / hz:.1f} s (both runs)"
        )
    finally:
        srv.terminate()
        srv.wait(timeout=10)


if __name__ == "__main__":
    main()
