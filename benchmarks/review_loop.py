"""What a review costs: chained reviews of one decision over real HTTP (re-derivation, Z3, render,
chained append; no LLM call), and the history of the resulting chain.

    .venv/bin/python benchmarks/review_loop.py [--reviews 30]

The service runs as `verdict serve api` in front of the scripted formalizer (one match makes the
first decision); printed: median and max milliseconds per review, the history's latency, and the
formalizer calls counted by the scripted server (the match's two value-miner passes, none after).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reviews", type=int, default=30)
    args = ap.parse_args()
    from verdict.data_gen.scripted_server import Script, ScriptedServer
    from verdict.serve.api_keys import KeyStore

    from tests.serve import test_reviews as fixture
    from tests.serve.conftest import start_service

    srv = ScriptedServer(Script.model_validate(fixture.SCRIPT)).start()
    svc = start_service(Path(tempfile.mkdtemp(prefix="review-bench-")) / "svc", srv.url, fixture.CONFIG)
    try:
        svc.keys["review"] = KeyStore(svc.folder / "keys.json").add("bench", ["review"])[0]
        with svc.client("admin") as admin:
            admin.post("/v1/trials", json={"program": fixture.program()}).raise_for_status()
        decision_id = fixture.match(svc)["decision_id"]
        calls_after_match = len(srv.requests)
        ms = []
        with svc.client("review") as c:
            for i in range(args.reviews):
                change = {**fixture.CONFIRM, "value": i % 2 == 0}
                t0 = time.perf_counter()
                r = c.post(f"/v1/decisions/{decision_id}/reviews", json={"changes": [change]})
                ms.append((time.perf_counter() - t0) * 1000)
                r.raise_for_status()
                decision_id = r.json()["decision_id"]
            t0 = time.perf_counter()
            history = c.get(f"/v1/decisions/{decision_id}/history").json()
            history_ms = (time.perf_counter() - t0) * 1000
        print(f"reviews: {args.reviews} chained, median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
        print(f"history: {len(history['entries'])} entries in {history_ms:.1f} ms")
        print(
            f"formalizer calls: {calls_after_match} for the match, {len(srv.requests) - calls_after_match} "
            "for the reviews"
        )
    finally:
        svc.stop()
        srv.stop()


if __name__ == "__main__":
    main()
