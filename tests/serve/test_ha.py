"""High availability: several formalizer endpoints behind each API replica (health-checked balancing,
failover, 503 only when none is left), and the whole picture under load: two API replicas on one
PostgreSQL audit store, two real CPU vLLM endpoints, one replica and one vLLM killed with -9 mid-load.

The fast tests use scripted OpenAI-compatible servers over real HTTP in front of a real service
process; the load test (`slow`, `vllm`) uses the real students.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from verdict.data_gen.formalizer.endpoints import ERRORS_IN_A_ROW
from verdict.data_gen.scripted_server import Script, ScriptedServer
from verdict.data_gen.scripted_server import ScriptedResponse as R
from verdict.serve.vllm.server import free_port

from tests.fixtures.vllm import teacher_programs
from tests.serve.conftest import RunningService, start_service, verdict_command
from tests.support import REPO

SCRIPTED_MODELS = {"parser_model": "scripted", "value_miner_model": "scripted"}  # all a scripted server lists


def pool_config(urls: list[str], **more) -> dict:
    return {"formalizer": {"base_url": None, "base_urls": urls, **SCRIPTED_MODELS, **more}}


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def upload(svc: RunningService, program) -> str:
    with svc.client("admin") as admin:
        r = admin.post("/v1/trials", json={"program": program.model_dump(mode="json", by_alias=True)})
    assert r.status_code == 200, r.text
    return r.json()["trial_id"]


def match(svc: RunningService, trial_id: str, patient: dict) -> httpx.Response:
    with svc.client() as c:
        return c.post(
            "/v1/match",
            json={
                "trial_id": trial_id,
                "patient": {"patient_id": patient["patient_id"], "note": patient["note"]},
            },
        )


# ---- several endpoints, one replica -----------------------------------------------------------------
def test_readyz_lists_every_endpoint_and_is_ready_while_one_serves(tmp_path):
    up = ScriptedServer().start()
    svc = start_service(tmp_path / "r", up.url, pool_config([up.url, dead_url()]))
    try:
        with svc.client(None) as c:
            r = c.get("/readyz")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["ready"] is True and [e["state"] for e in body["endpoints"]] == ["up", "down"]
            assert body["endpoints"][1]["reason"].startswith("not answering")
            assert body["endpoints"][0]["models"] == ["scripted"]
            up.stop()
            r = c.get("/readyz")
            assert r.status_code == 503 and r.json()["ready"] is False
            assert [e["state"] for e in r.json()["endpoints"]] == ["down", "down"]
            assert r.json()["reason"].startswith("no formalizer endpoint is ready")
    finally:
        svc.stop()


def test_a_failing_endpoint_is_skipped_and_the_match_still_decided(tmp_path, student_records):
    broken = ScriptedServer(Script(default=R(fault="status", status=500))).start()
    good = ScriptedServer(Script(default=R(auto="nulls"))).start()
    svc = start_service(
        tmp_path / "f", broken.url, pool_config([broken.url, good.url], health_check_interval_s=60)
    )
    try:
        program = next(iter(teacher_programs(student_records).values()))
        tid = upload(svc, program)
        for p in student_records["patients"][:3]:
            r = match(svc, tid, p)
            assert r.status_code == 200, r.text
            assert r.json()["models"]["endpoint"] == f"{broken.url[:-3]}, {good.url[:-3]}"
        # A 500 may be about one request: the broken server is marked down after ERRORS_IN_A_ROW of them
        # (both passes of a match may reach it before that).
        assert ERRORS_IN_A_ROW <= len(broken.requests) <= ERRORS_IN_A_ROW + 1 and len(good.requests) == 6
        with svc.client(None) as c:
            states = {e["endpoint"]: e for e in c.get("/readyz").json()["endpoints"]}
        assert states[broken.url[:-3]]["failures"] >= 1
        assert "failover:" in svc.log and "marked down: HTTP 500" in svc.log
    finally:
        svc.stop()
        broken.stop(), good.stop()


def test_503_with_retry_after_only_when_no_endpoint_is_left(tmp_path, student_records):
    a = ScriptedServer(Script(default=R(fault="status", status=503))).start()
    b = ScriptedServer(Script(default=R(fault="status", status=502))).start()
    svc = start_service(tmp_path / "n", a.url, {**pool_config([a.url, b.url]), "retry_after_s": 9})
    try:
        tid = upload(svc, next(iter(teacher_programs(student_records).values())))
        r = match(svc, tid, student_records["patients"][0])
        assert r.status_code == 503 and r.headers["retry-after"] == "9", r.text
        assert r.json()["error"] == "formalizer_unavailable"
        assert len(a.requests) >= 1 and len(b.requests) >= 1  # each was tried before giving up
    finally:
        svc.stop()
        a.stop(), b.stop()


def test_500s_to_some_pairs_of_a_batch_never_take_the_lone_formalizer_from_the_others(tmp_path):
    """Issue 22.9: the only formalizer answers 500 to the charts of three patients of a batch (a
    500 is about its request): those pairs fail, every other pair of the batch is decided (marked
    down, the endpoint made them 503 until its next check)."""
    from tests.serve.test_screen import NOTE_40, VALUES, _program

    srv = ScriptedServer(
        Script.model_validate(
            {
                "rules": [
                    {"match": {"contains": ["BROKEN"]}, "responses": [{"fault": "status", "status": 500}]}
                ],
                "default": {"auto": "nulls", "auto_values": VALUES},
            }
        )
    ).start()
    svc = start_service(tmp_path / "b", srv.url, {"formalizer": SCRIPTED_MODELS})
    try:
        with svc.client("admin") as admin:
            r = admin.post("/v1/trials", json={"program": _program("T-HA", 18, "has_chest_pain")})
            assert r.status_code == 200, r.text
        broken = [{"patient_id": f"B{i}", "note": f"BROKEN chart {i}"} for i in range(3)]
        healthy = [{"patient_id": f"H{i:02d}", "note": f"{NOTE_40} Visit {i}."} for i in range(16)]
        with svc.client() as c:
            r = c.post("/v1/match/batch", json={"trial_ids": ["T-HA"], "patients": broken + healthy})
        assert r.status_code == 200, r.text
        lines = {x["patient_id"]: x for x in map(json.loads, r.text.splitlines())}
        failed = {p: x["error"] for p, x in lines.items() if p.startswith("H") and x["status"] != 200}
        assert sorted(p for p in lines if p.startswith("H")) == [p["patient_id"] for p in healthy]
        assert not failed, (failed, svc.log[-3000:])
        for p in broken:
            assert "HTTP 500 from the formalizer" in lines[p["patient_id"]]["error"]["message"]
        assert "marked down" not in svc.log
    finally:
        svc.stop()
        srv.stop()


def test_refuses_to_start_when_any_endpoint_is_off_the_allowlist(tmp_path):
    svc = start_service(
        tmp_path / "e",
        "http://127.0.0.1:9/v1",
        pool_config(["http://127.0.0.1:9/v1", "http://gpu02.example.org/v1"]),
        wait=False,
    )
    assert svc.process.wait(timeout=60) != 0
    err = (svc.folder / "stderr.txt").read_text()
    assert "gpu02.example.org" in err and "allowlist" in err and "Traceback" not in err


def test_base_url_and_base_urls_together_is_a_config_error():
    from verdict.serve.api_config import ApiConfig

    with pytest.raises(ValueError, match="either base_url or base_urls"):
        ApiConfig.model_validate({"formalizer": {"base_url": "http://a/v1", "base_urls": ["http://b/v1"]}})


# ---- two replicas, one PostgreSQL, two formalizers; one replica and one formalizer killed mid-load --
LOAD_REQUESTS, LOAD_CONCURRENCY = 80, 8
KILL_AFTER = LOAD_REQUESTS // 4  # answers received before the kills


def test_two_replicas_on_postgres_scripted_formalizer_and_replica_killed_mid_load(
    tmp_path, student_records, postgres_db
):
    """The HA scenario without models (runs wherever PostgreSQL does): scripted formalizers in their own
    processes, answering every value-miner call with nulls after 50 ms."""
    formalizers = [_scripted_process(tmp_path / f"scripted-{i}.log") for i in range(2)]
    try:
        urls = [url for _, url in formalizers]
        numbers = ha_load(
            tmp_path,
            postgres_db,
            urls,
            lambda: os.kill(formalizers[1][0].pid, signal.SIGKILL),
            teacher_programs(student_records),
            student_records["patients"],
            formalizer={**SCRIPTED_MODELS},
        )
        assert numbers
    finally:
        for proc, _ in formalizers:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.vllm
def test_two_replicas_two_vllms_one_of_each_killed_mid_load(
    tmp_path, vllm_server, student_records, postgres_db
):
    from verdict.serve.vllm.server import VLLMServer

    from tests.serve.test_app import core_decision

    t0 = time.monotonic()
    # A second vLLM with the same students (its own port, log and temp folder).
    second = VLLMServer(vllm_server.config.model_copy(update={"log_file": str(tmp_path / "vllm-b.log")}))
    second.start()
    try:
        expected = {
            (t["trial_id"], p["patient_id"]): json.loads(
                core_decision(student_records, t["trial_id"], p)[2].canonical_json()
            )
            for t in student_records["trials"]
            for p in student_records["patients"]
        }
        # Kill its leader only, as the attack did; the engine process stays for `second.stop()`.
        numbers = ha_load(
            tmp_path,
            postgres_db,
            [vllm_server.base_url, second.base_url],
            lambda: os.kill(second.process.pid, signal.SIGKILL),
            teacher_programs(student_records),
            student_records["patients"],
            expected=expected,
        )
        print(f"{numbers}, {time.monotonic() - t0:.0f} s with the second vLLM's start")
    finally:
        second.stop()


def _scripted_process(log: Path) -> tuple[subprocess.Popen, str]:
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "verdict.data_gen.scripted_server", "--latency", "0.05", "--log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    return proc, line.split()[1]


def ha_load(
    tmp_path: Path,
    postgres_db,
    urls: list[str],
    kill_formalizer,
    programs: dict,
    patients: list,
    *,
    formalizer: dict | None = None,
    expected: dict | None = None,
) -> str:
    """Two API replicas (the same serve config) on one PostgreSQL store in front of ``urls``; a bounded
    load over both; after KILL_AFTER answers, kill -9 replica 2 and ``kill_formalizer()``. Asserts the
    HA guarantees and returns the observed numbers."""
    from verdict.serve.api_config import ApiConfig
    from verdict.serve.audit.store import open_store

    from tests.fixtures.postgres import ADMIN_PASSWORD_ENV, PASSWORD_ENV, WRITER

    t_start = time.monotonic()
    r = subprocess.run(
        [
            *verdict_command(),
            "serve",
            "audit",
            "setup-postgres",
            "--url",
            postgres_db.admin_url,
            "--writer",
            WRITER,
            "--password-env",
            ADMIN_PASSWORD_ENV,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    api = {
        # The load repeats pairs: without reuse_values off, repeats would ask the formalizer nothing, and
        # this is about failover while it is being asked.
        "formalizer": {
            "base_url": None,
            "base_urls": urls,
            "health_check_interval_s": 1,
            "concurrency": LOAD_CONCURRENCY,
            "reuse_values": False,
            **(formalizer or {}),
        },
        "audit_db": postgres_db.writer_url,
        "audit_password_env": PASSWORD_ENV,
    }
    replicas: list[RunningService] = []
    try:
        replicas.append(start_service(tmp_path / "replica-1", urls[0], api))
        # The same serve config, keys included: only the process, port and log differ.
        replicas.append(
            start_service(
                tmp_path / "replica-2", urls[0], {**api, "api_keys": str(replicas[0].folder / "keys.json")}
            )
        )
        for program in programs.values():  # the programs the value miner learned on
            upload(replicas[0], program)
        pairs = [(tid, p) for tid in programs for p in patients]
        work = [(i % 2, *pairs[i % len(pairs)]) for i in range(LOAD_REQUESTS)]

        def kill() -> None:
            os.kill(replicas[1].process.pid, signal.SIGKILL)
            kill_formalizer()

        t_load = time.monotonic()
        results = asyncio.run(_load([s.url for s in replicas], replicas[0].keys["match"], work, kill))
        load_s = time.monotonic() - t_load

        done = [x for x in results if x["status"] is not None]
        cut = [x for x in results if x["status"] is None]
        ok = [x for x in done if x["status"] == 200]
        unavailable = [x for x in done if x["status"] == 503]
        rerouted = sum(x["rerouted"] for x in results)
        failovers = sum(s.log.count("failover:") for s in replicas)
        # The killed formalizer is noticed by a request (a failover) or, first, by the 1 s health check.
        noticed = failovers + sum(s.log.count("marked down") + s.log.count(" down: ") for s in replicas)
        numbers = (
            f"HA load: {len(work)} matches at concurrency {LOAD_CONCURRENCY} over 2 replicas in "
            f"{load_s:.1f} s "
            f"({time.monotonic() - t_start:.0f} s with setup): {len(ok)} x 200, {len(unavailable)} x 503, "
            f"{len(cut)} cut with the killed replica, {rerouted} re-sent to the other replica (never "
            f"connected), {failovers} formalizer failovers, {noticed} times the killed formalizer was noticed"
        )
        print("\n" + numbers)
        # Every accepted request ends in a decision or a clean 503; a cut connection only on the killed one.
        assert {x["status"] for x in done} <= {200, 503}, [x for x in done if x["status"] not in (200, 503)]
        assert all(x["retry_after"] for x in unavailable)
        assert all(x["replica"] == 1 for x in cut), cut
        assert len(ok) >= len(work) // 2 and noticed >= 1, numbers
        if expected is not None:
            assert all(x["decision"] == expected[x["pair"]] for x in ok)  # failover changes no answer
        else:
            by_pair: dict = {}
            for x in ok:
                assert by_pair.setdefault(x["pair"], x["decision"]) == x["decision"]
        # No decision lost or duplicated: every 200 is in the store, once; nothing else but what the
        # killed replica may have written for requests cut with it.
        ids = [x["decision_id"] for x in ok]
        assert len(set(ids)) == len(ids)
        store = open_store(
            ApiConfig(audit_db=postgres_db.writer_url, audit_password_env=PASSWORD_ENV), read_only=True
        )
        try:
            for x in ok:
                row = store.decision(x["decision_id"])
                assert row is not None and row.decision == x["decision"]["decision"]
            stored = store.count("decisions")
        finally:
            store.close()
        assert len(ok) <= stored <= len(ok) + len(cut)
        r = subprocess.run(
            [
                *verdict_command(),
                "serve",
                "audit",
                "verify",
                "--config",
                str(replicas[0].folder / "serve.yaml"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert r.returncode == 0 and "intact" in r.stderr, r.stderr
        with replicas[0].client(None) as c:
            ready = c.get("/readyz").json()
        assert ready["ready"] is True and [e["state"] for e in ready["endpoints"]] == ["up", "down"]
        return numbers
    finally:
        for s in replicas:
            s.stop()


async def _load(urls: list[str], key: str, work: list, kill) -> list[dict]:
    """The client load, spread over the replicas as a load balancer would: a request that could not
    connect (nothing accepted it) is sent to the other replica; one cut mid-way is counted as such."""
    sem = asyncio.Semaphore(LOAD_CONCURRENCY)
    answered = 0
    killed = asyncio.Event()
    limits = httpx.Limits(max_connections=LOAD_CONCURRENCY, max_keepalive_connections=LOAD_CONCURRENCY)
    clients = [
        httpx.AsyncClient(
            base_url=u,
            headers={"Authorization": f"Bearer {key}"},
            timeout=600,
            limits=limits,
            trust_env=False,
        )
        for u in urls
    ]

    async def one(replica: int, tid: str, p: dict) -> dict:
        nonlocal answered
        out = {"replica": replica, "pair": (tid, p["patient_id"]), "status": None, "rerouted": 0}
        body = {"trial_id": tid, "patient": {"patient_id": p["patient_id"], "note": p["note"]}}
        async with sem:
            while True:
                try:
                    r = await clients[replica].post("/v1/match", json=body)
                except httpx.ConnectError as e:
                    if not out["rerouted"]:
                        out["rerouted"], replica = 1, 1 - replica
                        continue
                    out.update(replica=replica, error=type(e).__name__)
                    return out
                except httpx.TransportError as e:
                    out.update(replica=replica, error=type(e).__name__)
                    return out
                break
        out.update(replica=replica, status=r.status_code, retry_after=r.headers.get("retry-after"))
        if r.status_code == 200:
            out.update(decision_id=r.json()["decision_id"], decision=r.json()["decision"])
        answered += 1
        if answered >= KILL_AFTER and not killed.is_set():
            killed.set()
            kill()
        return out

    try:
        return await asyncio.gather(*(one(*w) for w in work))
    finally:
        for c in clients:
            await c.aclose()
