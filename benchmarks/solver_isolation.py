"""Solver isolation (issue 22 item 2): does hard solver work make a trivial match wait, and how do
decisions scale with worker processes?

    .venv/bin/python benchmarks/solver_isolation.py [--matches 7] [--decisions 300]

1. Over real HTTP (`verdict serve api` in front of the scripted formalizer, solver limit 5 s, the
   default solver pool): the median latency of a trivial match alone, then while 4 concurrent trial
   revisions with a hard nonlinear criterion (x^3 + y^3 + z^3 = 33) run into the solver limit: the
   matches are sent once the 4 revisions are in the solver pool, for as long as none has finished.
2. In process (verdict.core.solver_pool.SolverPool): decisions per second over the example cases
   with 1 and with 2 worker processes (all submitted at once, after a warm-up).

Ends with one line:
`solver-isolation: alone_ms=A under_load_ms=B ratio=R decisions_per_s_1=X decisions_per_s_2=Y`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HARD_REVISIONS = 4


def timed_match(svc) -> float:
    with svc.client() as c:
        t0 = time.perf_counter()
        r = c.post(
            "/v1/match", json={"trial_id": "T-EASY", "patient": {"patient_id": "P1", "note": "Patient note."}}
        )
        ms = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return ms


def isolation(matches: int) -> tuple[float, float]:
    """(alone_ms, under_load_ms): medians of trivial-match latencies."""
    from verdict.data_gen.scripted_server import Script, ScriptedServer
    from verdict.serve.api_keys import KeyStore

    from tests.serve import test_solver_isolation as fixture
    from tests.serve.conftest import start_service
    from tests.serve.programs import cubes, program

    srv = ScriptedServer(Script.model_validate(fixture.SCRIPT)).start()
    folder = Path(tempfile.mkdtemp(prefix="solver-isolation-")) / "svc"
    svc = start_service(folder, srv.url, {"formalizer": fixture.FORMALIZER, "solver_timeout_ms": 5000})
    try:
        svc.keys["trial_owner"] = KeyStore(svc.folder / "keys.json").add("bench", ["trial_owner"])[0]
        with svc.client("admin") as admin:
            for tid in ("T-EASY", "T-HARD"):
                admin.post("/v1/trials", json={"program": program(tid, "age_years")}).raise_for_status()
        for _ in range(3):  # warm: first-request costs, compiled programs
            timed_match(svc)
        alone = [timed_match(svc) for _ in range(matches)]
        done: list[int] = []

        def revise():
            with svc.client("trial_owner") as o:
                hard = cubes("T-HARD", 1)
                done.append(
                    o.post("/v1/trials/T-HARD/revisions", json={"program": hard, "reason": "x"}).status_code
                )

        threads = [threading.Thread(target=revise) for _ in range(HARD_REVISIONS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while fixture.jobs_in_pool(svc) < HARD_REVISIONS and time.monotonic() < deadline:
            time.sleep(0.02)
        loaded = []
        while not done and len(loaded) < matches:
            loaded.append(timed_match(svc))
        hard_busy = len(loaded) - (1 if done else 0)  # the last may have ended after a revision
        for t in threads:
            t.join()
        a, b = statistics.median(alone), statistics.median(loaded)
        print(f"trivial match alone: median {a:.1f} ms (max {max(alone):.1f}, n={len(alone)})")
        print(
            f"trivial match while {HARD_REVISIONS} hard revisions run: median {b:.1f} ms "
            f"(max {max(loaded):.1f}, n={len(loaded)}, {hard_busy} sent and answered before any revision "
            f"ended); the revisions answered {sorted(done)}"
        )
        return a, b
    finally:
        svc.stop()
        srv.stop()


def throughput(workers: int, n: int) -> float:
    """Decisions per second of a pool of `workers` processes over the example cases."""
    from verdict.core.cases import load_case
    from verdict.core.policy import load_policy
    from verdict.core.solver_pool import SolverPool

    root = Path(__file__).resolve().parent.parent
    policy = load_policy("prescreen")
    pairs = [
        (c.program, c.patient_under(policy))
        for c in map(load_case, sorted(root.glob("examples/cases/*.json")))
    ]
    pool = SolverPool(workers=workers)
    try:
        for f in [pool.submit_decide(*pairs[i % len(pairs)]) for i in range(20 * workers)]:  # warm
            f.result()
        t0 = time.perf_counter()
        futures = [pool.submit_decide(*pairs[i % len(pairs)]) for i in range(n)]
        for f in futures:
            f.result()
        rate = n / (time.perf_counter() - t0)
    finally:
        pool.close()
    print(f"decisions per second with {workers} worker(s): {rate:.1f} ({n} decisions)")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matches", type=int, default=7, help="trivial matches per condition")
    ap.add_argument("--decisions", type=int, default=300, help="decisions per throughput run")
    args = ap.parse_args()
    alone, loaded = isolation(args.matches)
    one, two = throughput(1, args.decisions), throughput(2, args.decisions)
    print(f"scaling 1 -> 2 workers: {two / one:.2f}x")
    print(
        f"solver-isolation: alone_ms={alone:.1f} under_load_ms={loaded:.1f} ratio={loaded / alone:.2f} "
        f"decisions_per_s_1={one:.1f} decisions_per_s_2={two:.1f}"
    )


if __name__ == "__main__":
    main()
