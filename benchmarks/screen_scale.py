"""One patient screened against a site's worth of registered trials: time and the service's memory.

    .venv/bin/python benchmarks/screen_scale.py [--trials 1000,2000]

For each count, a fresh service (`verdict serve api`, SQLite store) with that many registered trials
(four small programs under as many ids: tests/serve/test_screen.py `start_site`), the scripted
formalizer answering the miner (no model: what is measured is the service, the solver and the
store), then one `POST /v1/screen` without `trial_ids`. Printed per count: wall seconds, pairs per
second, the service's CPU milliseconds per pair, its resident memory before the screen and its peak
(VmHWM) after, and the marginal peak per pair from the previous count. The service's bounded caches
(compiled programs, programs, mined values) fill within the first few hundred trials; past them the
screen keeps a small ranked row per pair, never the full answers, so the marginal cost is that row
(and its share of the response). Ends with one line, for the largest count:
`screen-scale: trials=N pairs_per_s=X peak_rss_mb=M marginal_kb_per_pair=G`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _proc(pid: int) -> tuple[float, float, float]:
    """CPU seconds, resident MB and peak resident MB of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return cpu, int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def measure(n: int) -> dict:
    from tests.serve.test_screen import NOTE_40, start_site

    svc, srv = start_site(Path(tempfile.mkdtemp(prefix="screen-bench-")), n, {"max_screen_pairs": n})
    try:
        pid = svc.process.pid
        cpu0, rss0, _ = _proc(pid)
        t0 = time.perf_counter()
        with svc.client("match", timeout=3600) as c:
            r = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}})
        wall = time.perf_counter() - t0
        cpu1, _, peak = _proc(pid)
        if r.status_code != 200:
            raise SystemExit(f"screen of {n} trials: HTTP {r.status_code}: {r.text[:300]}")
        body = r.json()
        assert body["pairs"] == n and len(body["rows"]) + len(body["failures"]) == n
    finally:
        svc.stop()
        srv.stop()
    return {
        "trials": n,
        "wall_s": wall,
        "pairs_per_s": n / wall,
        "cpu_ms_per_pair": 1000 * (cpu1 - cpu0) / n,
        "rss_before_mb": rss0,
        "peak_rss_mb": peak,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", default="1000,2000", help="comma-separated trial counts")
    counts = [int(x) for x in ap.parse_args().trials.split(",")]
    prev, marginal = None, float("nan")
    for n in counts:
        m = measure(n)
        if prev is not None and n > prev["trials"]:
            marginal = 1024 * (m["peak_rss_mb"] - prev["peak_rss_mb"]) / (n - prev["trials"])
        print(
            f"trials={n:>6}  wall={m['wall_s']:7.1f} s  pairs/s={m['pairs_per_s']:6.1f}  "
            f"service cpu/pair={m['cpu_ms_per_pair']:5.1f} ms  rss before={m['rss_before_mb']:6.1f} MB  "
            f"peak={m['peak_rss_mb']:6.1f} MB  marginal/pair={marginal:6.1f} KB",
            flush=True,
        )
        prev = m
    print(
        f"screen-scale: trials={prev['trials']} pairs_per_s={prev['pairs_per_s']:.1f} "
        f"peak_rss_mb={prev['peak_rss_mb']:.0f} marginal_kb_per_pair={marginal:.1f}"
    )


if __name__ == "__main__":
    main()
