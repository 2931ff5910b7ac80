"""A bounded load test on loopback: 200 matches at concurrency 32 through the service to the real
CPU vLLM students, with zero errors and every decision equal to the core's. Speed is reported, not
asserted (benchmarks/serve_overhead.py measures it)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.fixtures.vllm import trial_text
from tests.serve.conftest import start_service
from tests.serve.test_app import core_decision

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
REQUESTS, CONCURRENCY = 200, 32


def test_200_matches_at_concurrency_32_without_errors(tmp_path, vllm_server, student_records):
    svc = start_service(tmp_path / "load", vllm_server.base_url, {"formalizer": {"concurrency": CONCURRENCY}})
    try:
        with svc.client() as c:
            for t in student_records["trials"]:
                assert (
                    c.post(
                        "/v1/trials", json={"text": trial_text(t).model_dump(exclude_none=True)}
                    ).status_code
                    == 200
                )
        pairs = [(t["trial_id"], p) for t in student_records["trials"] for p in student_records["patients"]]
        expected = {
            (tid, p["patient_id"]): json.loads(core_decision(student_records, tid, p)[2].canonical_json())
            for tid, p in pairs
        }
        results = asyncio.run(
            _load(svc.url, svc.keys["match"], [pairs[i % len(pairs)] for i in range(REQUESTS)])
        )
        statuses = [s for s, _, _ in results]
        assert statuses == [200] * REQUESTS, {s: statuses.count(s) for s in set(statuses)}
        for _, key, decision in results:
            assert decision == expected[key]
        with svc.client("audit") as a:
            metrics = a.get("/metrics").text
        assert (
            f'verdict_requests_total{{method="POST",route="/v1/match",status="200"}} {float(REQUESTS)}'
            in metrics
        )
        assert (
            "verdict_errors_total" not in metrics
            or 'verdict_errors_total{code="internal_error"}' not in metrics
        )
    finally:
        svc.stop()


async def _load(url: str, key: str, work: list) -> list:
    sem = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600, limits=limits, trust_env=False
    ) as client:

        async def one(tid: str, p: dict):
            async with sem:
                r = await client.post(
                    "/v1/match",
                    json={"trial_id": tid, "patient": {"patient_id": p["patient_id"], "note": p["note"]}},
                )
                body = r.json()
                return r.status_code, (tid, p["patient_id"]), body.get("decision")

        t0 = time.monotonic()
        out = await asyncio.gather(*(one(tid, p) for tid, p in work))
        dt = time.monotonic() - t0
    print(f"\n{len(work)} matches at concurrency {CONCURRENCY}: {dt:.1f} s, {len(work) / dt:.2f} matches/s")
    return out
