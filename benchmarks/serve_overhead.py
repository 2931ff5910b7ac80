"""What the matching service costs on top of the students, and how many matches per second it serves.

    .venv/bin/python benchmarks/serve_overhead.py [--work runs/bench-serve] [--requests 60]
        [--concurrency 1,6,32] [--formalizer-url URL --service-url URL --key KEY]
    .venv/bin/python benchmarks/serve_overhead.py --edge     # no vLLM: the HTTP edge and the event loop

By default it builds the tiny CPU students the tests use (tiny Qwen2 base, two LoRA adapters trained
through `train/` on the recorded teacher outputs; kept in --work, so a rerun skips training),
starts vLLM and the service, measures, and stops both. With --formalizer-url/--service-url/--key it
measures a stack that is already running (a GPU site: then pass --records for its own records).

Printed, all from the same run:
- overhead: each request both ways, interleaved, one at a time: *direct* = the two value-miner
  requests a match makes (same bodies, the same structured-output schema), sent straight to vLLM in
  parallel; *service* = POST /v1/match (those two calls + validation, policy, Z3, rationale, audit,
  HTTP). Every request carries a note no earlier request had (the recorded note plus a visit
  number), so neither the service's caches nor its reuse of mined values can answer it: both sides
  make the same two vLLM calls (printed, from vLLM's own counter). Ratio of medians, and the
  milliseconds the service adds per match.
- throughput: matches/s through the service at each concurrency, and vLLM's pairs-of-calls/s at the
  same concurrency, for comparison, with vLLM's own request count per match (2 on both sides).

`--edge` needs no model (the scripted formalizer answers at once) and prints:
- per-request latency on one reused (keep-alive) connection: GET /healthz and POST /v1/match - what
  the edge adds (a socket without TCP_NODELAY adds ~40 ms here);
- /healthz latency (median, max) while the solver works: during a program upload whose 40 criteria
  are hard (x^3 + y^3 + z^3 = k) and during a match whose decision runs into the solver limit, with
  how long each took (one limit per request, not one per criterion).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ROUNDS = 3
RECORDS = REPO / "examples" / "demo" / "teacher_records.json"  # the demo's recorded teacher outputs


def build_students(work: Path, records: dict) -> tuple[Path, dict[str, Path]]:
    """The tests' recipe (serve/students.py), cached in ``work``."""
    from verdict.serve.students import TRAIN_STEPS, build_student_base, train_student, write_student_export

    base = work / "base"
    if not (base / "config.json").exists():
        print("building the tiny student base", flush=True)
        build_student_base(base)
    adapters = {t: work / "runs" / f"tiny-{t}" / "adapter" for t in ("parser", "value_miner")}
    if not all((a / "adapter_config.json").exists() for a in adapters.values()):
        export = write_student_export(records, work / "export")
        for task in adapters:
            print(
                f"training the {task} adapter ({TRAIN_STEPS[task]} steps; a few minutes on 2 cores)",
                flush=True,
            )
            adapters[task] = train_student(base, export / task, task, work / "runs", TRAIN_STEPS[task])
    return base, adapters


class MinerRequests:
    """The two chat-completion bodies the service sends for one match, built as the service builds
    them (same prompt, same structured-output schema)."""

    def __init__(self, records: dict, formalizer_url: str):
        from verdict.data_gen.formalizer import Formalizer
        from verdict.serve.api_config import FormalizerConfig
        from verdict.serve.students import STUDENT_MAX_TOKENS, teacher_programs

        fc = FormalizerConfig(max_tokens=STUDENT_MAX_TOKENS)
        self.endpoint = fc.endpoint(fc.value_miner_model, formalizer_url)
        self.fz = Formalizer(self.endpoint)
        self.programs = teacher_programs(records)
        self.notes = {p["patient_id"]: p["note"] for p in records["patients"]}
        self.pairs = [(tid, pid) for tid in self.programs for pid in self.notes]

    def bodies(self, tid: str, note: str) -> list[dict]:
        from verdict.data_gen.formalizer import build_request, core_schema, side_atoms, with_atom_enum

        program, out = self.programs[tid], []
        for side in ("inclusion", "exclusion"):
            names = side_atoms(program, side)
            req = build_request(
                self.endpoint,
                f"miner_{side}",
                self.fz.miner_messages(program, note, side, names),
                with_atom_enum(core_schema("value-miner"), names),
                "value_miner_output",
            )
            out.append({k: v for k, v in req.items() if k != "extra_body"} | req.get("extra_body", {}))
        return out


def fresh_note(note: str, i: int) -> str:
    """The recorded note made distinct for request i: no cache (the service's call cache, its reuse of
    mined values, vLLM's prefix cache beyond the shared prompt) can answer it, on either side."""
    return f"{note}\nVisit reference {i}."


async def measure(
    formalizer_url: str, service_url: str, key: str, records: dict, n: int, concurrencies: list[int]
) -> None:
    import itertools

    import httpx

    reqs = MinerRequests(records, formalizer_url)
    pairs = reqs.pairs
    serial = itertools.count()  # every request of either side gets a note no earlier request had
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(base_url=formalizer_url, timeout=600, limits=limits, trust_env=False) as vllm,
        httpx.AsyncClient(
            base_url=service_url,
            timeout=600,
            limits=limits,
            trust_env=False,
            headers={"Authorization": f"Bearer {key}"},
        ) as api,
    ):

        async def direct(pair) -> float:
            tid, pid = pair
            bodies = reqs.bodies(tid, fresh_note(reqs.notes[pid], next(serial)))
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(vllm.post("/chat/completions", json=b) for b in bodies))
            assert all(r.status_code == 200 for r in rs), [r.text[:200] for r in rs]
            return time.perf_counter() - t0

        async def service(pair) -> float:
            tid, pid = pair
            note = fresh_note(reqs.notes[pid], next(serial))
            t0 = time.perf_counter()
            r = await api.post(
                "/v1/match", json={"trial_id": tid, "patient": {"patient_id": pid, "note": note}}
            )
            assert r.status_code == 200, r.text[:300]
            assert r.json()["cost"]["mining"]["calls"] >= 2, "the service answered from a cache"
            return time.perf_counter() - t0

        for pair in pairs:  # warm-up: compiled programs, connections, grammars
            await direct(pair)
            await service(pair)
        d_lat, s_lat = [], []
        before = await vllm_calls(vllm, formalizer_url)
        for i in range(n):
            pair = pairs[i % len(pairs)]
            d_lat.append(await direct(pair))
            s_lat.append(await service(pair))
        per_match = (await vllm_calls(vllm, formalizer_url) - before) / (2 * n)
        dm, sm = statistics.median(d_lat), statistics.median(s_lat)
        print(
            f"\noverhead, {n} requests one at a time (interleaved; every note distinct, so no cache answers):"
        )
        print(f"  vLLM direct  median {dm * 1000:8.1f} ms   p90 {_p90(d_lat) * 1000:8.1f} ms")
        print(f"  service      median {sm * 1000:8.1f} ms   p90 {_p90(s_lat) * 1000:8.1f} ms")
        print(f"  vLLM calls per match, both sides: {per_match:.2f} (2 = like for like)")
        print(f"  ratio service/direct (medians): {sm / dm:.3f}")
        print(f"  the service adds {(sm - dm) * 1000:.1f} ms per match")

        print(f"\nthroughput (median of {ROUNDS} rounds, alternating which side goes first):")
        for c in concurrencies:
            total = max(n, 2 * c)
            rates: dict[str, list[float]] = {"vLLM direct": [], "service": []}
            calls: dict[str, float] = {"vLLM direct": 0.0, "service": 0.0}
            for r in range(ROUNDS):
                sides = [("vLLM direct", direct), ("service", service)]
                for name, fn in sides if r % 2 == 0 else sides[::-1]:
                    sem = asyncio.Semaphore(c)

                    async def bounded(pair, fn=fn, sem=sem):
                        async with sem:
                            return await fn(pair)

                    before, t0 = await vllm_calls(vllm, formalizer_url), time.perf_counter()
                    await asyncio.gather(*(bounded(pairs[i % len(pairs)]) for i in range(total)))
                    rates[name].append(total / (time.perf_counter() - t0))
                    calls[name] += (await vllm_calls(vllm, formalizer_url) - before) / (total * ROUNDS)
            d, s = statistics.median(rates["vLLM direct"]), statistics.median(rates["service"])
            print(
                f"  concurrency {c:3d}  vLLM direct {d:7.2f} matches/s   service {s:7.2f} matches/s   "
                f"(service/direct {s / d:.2f}; vLLM calls per match: direct {calls['vLLM direct']:.2f}, "
                f"service {calls['service']:.2f})"
            )


def edge(work: Path, requests: int) -> None:
    """The HTTP edge and the event loop, with the scripted formalizer (no model needed)."""
    import shutil
    import threading

    import httpx
    from verdict.data_gen.scripted_server import Script, ScriptedServer

    from tests.serve.conftest import start_service
    from tests.serve.test_security import CONFIG, SCRIPT, cubes, fermat, program

    limit_ms = CONFIG["solver_timeout_ms"]
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    shutil.rmtree(work / "edge-service", ignore_errors=True)
    svc = start_service(work / "edge-service", srv.url, CONFIG)
    try:
        with svc.client("admin") as c:
            for prog in (program("T-AGE", "age_years"), fermat("T-FERMAT")):
                c.post("/v1/trials", json={"program": prog}).raise_for_status()
            patient = {"patient_id": "P1", "note": "Patient note: 40 years old."}
            body = {"trial_id": "T-AGE", "patient": patient}
            c.post("/v1/match", json=body).raise_for_status()
            print(f"\nper request on one reused connection ({requests} each):")
            for name, send in (
                ("GET /healthz", lambda: c.get("/healthz")),
                ("POST /v1/match", lambda: c.post("/v1/match", json=body)),
            ):
                lat = []
                for _ in range(requests):
                    t0 = time.perf_counter()
                    send().raise_for_status()
                    lat.append(time.perf_counter() - t0)
                med, p90 = statistics.median(lat) * 1000, _p90(lat) * 1000
                print(f"  {name:16s} median {med:7.1f} ms   p90 {p90:7.1f} ms")

        print(f"\n/healthz while the solver works (solver limit {limit_ms} ms):")
        slow = {
            "idle (for comparison)": lambda c: time.sleep(1.0),
            "upload, 40 hard criteria": lambda c: c.post(
                "/v1/trials", json={"program": cubes("T-CUBES", 40)}
            ),
            "match, decision at the limit": lambda c: c.post(
                "/v1/match",
                json={"trial_id": "T-FERMAT", "patient": {"patient_id": "P2", "note": "w is zero."}},
            ),
        }
        for name, call in slow.items():
            lat, stop = [], threading.Event()

            def poll(lat=lat, stop=stop):
                while not stop.is_set():
                    t0 = time.perf_counter()
                    httpx.get(svc.url + "/healthz", timeout=300, trust_env=False)
                    lat.append(time.perf_counter() - t0)
                    time.sleep(0.02)

            th = threading.Thread(target=poll)
            th.start()
            time.sleep(0.2)
            with svc.client("admin", timeout=600) as c:
                t0 = time.perf_counter()
                r = call(c)
                took = time.perf_counter() - t0
            stop.set()
            th.join()
            status = f"HTTP {r.status_code}" if r is not None else "-"
            print(
                f"  {name:30s} took {took:6.2f} s ({status});  /healthz median "
                f"{statistics.median(lat) * 1000:6.1f} ms, max {max(lat) * 1000:7.1f} ms "
                f"({len(lat)} polls)"
            )
    finally:
        svc.stop()
        srv.stop()


async def vllm_calls(vllm, formalizer_url: str) -> float:
    """vLLM's own count of completed requests (its /metrics)."""
    text = (await vllm.get(formalizer_url.rstrip("/").removesuffix("/v1") + "/metrics")).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("vllm:request_success_total"))


def _p90(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.9 * len(xs))) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "bench-serve")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--concurrency", default="1,6,32", help="6 = every distinct recorded pair in flight")
    ap.add_argument("--formalizer-url")
    ap.add_argument("--service-url")
    ap.add_argument("--key")
    ap.add_argument("--records", type=Path, help="teacher records JSON (default: the tests' recorded set)")
    ap.add_argument(
        "--edge", action="store_true", help="no vLLM: edge latency and /healthz under solver load"
    )
    a = ap.parse_args()
    if a.edge:
        a.work.mkdir(parents=True, exist_ok=True)
        edge(a.work, min(a.requests, 200))
        return
    from verdict.serve.students import load_teacher_records, student_vllm_config, trial_text

    records = load_teacher_records(a.records or RECORDS)
    concurrencies = [int(x) for x in a.concurrency.split(",")]
    if a.formalizer_url and a.service_url and a.key:
        asyncio.run(measure(a.formalizer_url, a.service_url, a.key, records, a.requests, concurrencies))
        return

    from verdict.serve.vllm.server import VLLMServer

    from tests.serve.conftest import start_service

    a.work.mkdir(parents=True, exist_ok=True)
    base, adapters = build_students(a.work, records)
    server = VLLMServer(student_vllm_config(base, adapters, a.work / "vllm.log"))
    print("starting vLLM (CPU)", flush=True)
    t0 = time.monotonic()
    server.start()
    print(f"vLLM ready in {time.monotonic() - t0:.0f} s; starting the service", flush=True)
    svc = None
    try:
        import shutil

        shutil.rmtree(a.work / "service", ignore_errors=True)
        svc = start_service(
            a.work / "service",
            server.base_url,
            {"formalizer": {"concurrency": 64}, "limits": {"batch_concurrency": 32}},
        )
        with svc.client() as c:
            for t in records["trials"]:
                r = c.post("/v1/trials", json={"text": trial_text(t).model_dump(exclude_none=True)})
                r.raise_for_status()
        asyncio.run(measure(server.base_url, svc.url, svc.keys["match"], records, a.requests, concurrencies))
    finally:
        if svc is not None:
            svc.stop()
        server.stop()


if __name__ == "__main__":
    main()
