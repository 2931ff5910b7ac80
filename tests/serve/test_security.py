"""The matching service under attack (issue 11): shared work and cancellation, the event loop under
slow solvers, the key file, authentication and lockout, docs, headers, note text at rest and in
errors, markup in the rationale. Real HTTP against a real `verdict serve api` process; the
formalizer is the project's scripted OpenAI-compatible server (data_gen/scripted_server.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import socket
import stat
import statistics
import threading
import time

import httpx
import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer

from tests.serve.conftest import start_service
from tests.serve.programs import cubes, fermat, program
from tests.support import run_together, wait_until

NAME = "Zyxwvut Quorlin"
SECRET_NOTE = f"Patient {NAME}, MRN-99887766, 40 years old. Reports chest pain since May."
SF_NOTE = "Single-flight note: 40 years old, no chest pain."
BATCH_NOTE = "Batch note {i}: 40 years old."
MARKUP_NOTE = "40 years old <img src=x onerror=alert(1)> and [a link](http://evil.example)."


def values(*items, latency: float = 0.0) -> dict:
    return {
        "content": {"values": [{"atom": a, "value": v, "evidence": e} for a, v, e in items]},
        "latency_s": latency,
    }


AGE = '"name": "age_years"'
BMI = '"name": "bmi"'
PAIN = '"name": "has_chest_pain"'
SCRIPT = {
    "rules": [
        # single flight: the bmi trial's inclusion pass fails after 0.6 s; the exclusion pass, shared
        # by both trials, takes 2 s
        {
            "match": {"contains": [SF_NOTE, BMI]},
            "responses": [{"fault": "status", "status": 400, "latency_s": 0.6}],
        },
        {
            "match": {"contains": [SF_NOTE, PAIN]},
            "responses": [values(("has_chest_pain", False, "no chest pain"), latency=2.0)],
        },
        {"match": {"contains": [SF_NOTE, AGE]}, "responses": [values(("age_years", 40, "40 years old"))]},
        # batches: the bmi trial's inclusion fails (HTTP 500) while the shared exclusion pass runs
        {
            "match": {"contains": ["Batch note", BMI]},
            "responses": [{"fault": "status", "status": 500, "latency_s": 0.2}],
        },
        {"match": {"contains": ["Batch note", PAIN]}, "responses": [{"auto": "nulls", "latency_s": 0.8}]},
        {
            "match": {"contains": ["Batch note", AGE]},
            "responses": [values(("age_years", 40, "40 years old"))],
        },
        # an upstream error that echoes a short fragment of the note
        {
            "match": {"contains": [NAME, AGE]},
            "responses": [{"fault": "status", "status": 400, "message": f"error processing patient {NAME}"}],
        },
        {"match": {"contains": [NAME, PAIN]}, "responses": [{"auto": "nulls"}]},
        # markup in the note, quoted as evidence
        {
            "match": {"contains": ["onerror", AGE]},
            "responses": [values(("age_years", 40, "40 years old <img src=x onerror=alert(1)>"))],
        },
        {"match": {"contains": ["onerror", PAIN]}, "responses": [{"auto": "nulls"}]},
        # a hard decision: w observed, the rest open
        {
            "match": {"contains": ["w is zero", '"name": "w"']},
            "responses": [values(("w", 0, "w is zero"), ("x", None, ""), ("y", None, ""), ("z", None, ""))],
        },
        {"match": {"contains": ["Patient note"]}, "responses": [{"auto": "nulls"}]},
    ],
}
CONFIG = {
    "formalizer": {
        "parser_model": "scripted",
        "value_miner_model": "scripted",
        # room for every atom of a side in one call (the scripted answers cover a whole side)
        "max_tokens": {"parser": 2048, "miner_inclusion": 1024, "miner_exclusion": 1024},
    },
    "solver_timeout_ms": 1000,
    "limits": {"batch_concurrency": 4},
}


TRIALS = [program("T-BMI", "bmi"), program("T-AGE", "age_years")]


@pytest.fixture(scope="module")
def svc(tmp_path_factory, scripted):
    s = start_service(tmp_path_factory.mktemp("security"), scripted.url, CONFIG)
    s.upload(*TRIALS)
    yield s
    s.stop()


def match(c: httpx.Client, trial_id: str, note: str, patient_id: str = "P1") -> httpx.Response:
    return c.post(
        "/v1/match", json={"trial_id": trial_id, "patient": {"patient_id": patient_id, "note": note}}
    )


class HealthPoller:
    """Polls /healthz while something else runs; keeps every latency."""

    def __init__(self, url: str):
        self.url, self.latencies, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with httpx.Client(base_url=self.url, timeout=60, trust_env=False) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    c.get("/healthz")
                except httpx.HTTPError:
                    pass
                self.latencies.append(time.perf_counter() - t0)
                time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()


# ---- item 2: shared work survives the cancellation of one waiter -------------------------------
def test_a_cancelled_request_leaves_the_shared_call_to_the_others(svc, scripted):
    """A's inclusion pass fails, which cancels A's exclusion pass; B waits on that same (shared)
    exclusion call and must still get its decision."""
    scripted.reset()
    out = {}

    def run(name, trial_id, delay):
        time.sleep(delay)
        with svc.client() as c:
            out[name] = match(c, trial_id, SF_NOTE, f"P-{name}")

    run_together(functools.partial(run, "A", "T-BMI", 0.0), functools.partial(run, "B", "T-AGE", 0.2))
    assert out["A"].status_code == 502, out["A"].text  # its own failure, as JSON
    assert out["B"].status_code == 200, out["B"].text
    assert out["B"].json()["decision"]["decision"] == "eligible"
    exclusion_calls = [
        r
        for r in scripted.requests
        if "has_chest_pain" in json.dumps(r.body) and "Single-flight" in json.dumps(r.body)
    ]
    assert len(exclusion_calls) == 1  # one upstream call, shared


def test_a_batch_stream_ends_with_a_line_per_pair_when_the_formalizer_fails(tmp_path):
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    s = start_service(tmp_path / "batch", srv.url, CONFIG)
    try:
        s.upload(*TRIALS)
        patients = [{"patient_id": f"B{i}", "note": BATCH_NOTE.format(i=i)} for i in range(6)]
        lines = []
        with s.client() as c:
            body = {"patients": patients, "trial_ids": ["T-BMI", "T-AGE"]}
            with c.stream("POST", "/v1/match/batch", json=body) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line:
                        lines.append(json.loads(line))
                        if len(lines) == 2:
                            srv.stop()  # the formalizer goes away mid-stream
        assert sorted(x["index"] for x in lines) == list(range(12))
        assert {x["status"] for x in lines} <= {200, 502, 503}
        assert all(x["error"]["error"] != "internal_error" for x in lines if x["status"] != 200)
    finally:
        s.stop()


# ---- item 3: no solver work on the event loop, one time limit per request -----------------------
def test_a_slow_upload_check_neither_blocks_health_nor_takes_a_limit_per_criterion(svc):
    with svc.client("admin") as admin, HealthPoller(svc.url) as poll:
        time.sleep(0.2)
        t0 = time.monotonic()
        r = admin.post("/v1/trials", json={"program": cubes("T-CUBES", 40)}, timeout=120)
        took = time.monotonic() - t0
        time.sleep(0.2)
    assert r.status_code == 422, r.text
    assert "1000 ms" in r.text
    # issue 22.13: a solver limit is not a proof of unsatisfiability
    assert "is unknown within the solver limit" in r.json()["message"] and "cannot be satisfied" not in r.text
    assert took < 5.0, took  # one limit of 1 s (plus compiling), not 40
    assert len(poll.latencies) > 2 and max(poll.latencies) < 1.0, max(poll.latencies)


def test_a_slow_match_does_not_block_health(svc):
    hard = fermat("T-FERMAT")
    with svc.client("admin") as admin:
        assert admin.post("/v1/trials", json={"program": hard}).status_code == 200
    with svc.client() as c, HealthPoller(svc.url) as poll:
        time.sleep(0.2)
        t0 = time.monotonic()
        r = match(c, "T-FERMAT", "Fermat note: w is zero.")
        took = time.monotonic() - t0
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    d = r.json()["decision"]
    assert d["decision"] == "undetermined" and "1000 ms per decision" in d["reason"]
    assert took < 5.0, took
    assert len(poll.latencies) > 2 and max(poll.latencies) < 1.0, max(poll.latencies)


# ---- item 5: a broken key file at run time ---------------------------------------------------------
def test_a_truncated_key_file_keeps_the_last_good_keys(tmp_path, scripted):
    s = start_service(tmp_path / "keys", scripted.url, CONFIG)
    try:
        keys = s.folder / "keys.json"
        good = keys.read_text()
        keys.write_text(good[: len(good) // 2])  # truncated mid-write
        with s.client("audit") as a:
            r = a.get("/metrics")
        assert r.status_code == 200, r.text
        assert "unreadable" in s.log and "keeping the 3 keys" in s.log
        keys.write_text(good)
        with s.client("audit") as a:
            assert a.get("/metrics").status_code == 200
    finally:
        s.stop()


# ---- item 6: TCP_NODELAY --------------------------------------------------------------------------
def test_the_service_socket_is_tcp_so_asyncio_sets_nodelay(svc):
    from verdict.serve.api_server import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
    # on a reused connection, a small response is not held back by Nagle (~40 ms each)
    with svc.client("audit") as c:
        c.get("/metrics")
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            assert c.get("/v1/trials/T-AGE").status_code in (200, 403)
            times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.035, times


# ---- item 7: store_notes false keeps no note text --------------------------------------------------
def test_store_notes_false_keeps_hashes_and_offsets_only(tmp_path, scripted):
    s = start_service(tmp_path / "nonotes", scripted.url, CONFIG | {"store_notes": False})
    try:
        with s.client("admin") as admin:
            assert (
                admin.post("/v1/trials", json={"program": program("T-AGE", "age_years")}).status_code == 200
            )
            r = match(admin, "T-AGE", SF_NOTE)
            assert r.status_code == 200, r.text
            assert r.json()["patient"]["resolutions"][0]["evidence"] == "40 years old"  # the caller's answer
            rec = admin.get(r.json()["links"]["decision"])
            page = admin.get(r.json()["links"]["page"])
        assert rec.status_code == 200 and rec.json()["note_stored"] is False
        stored = json.dumps(rec.json()["artifacts"])
        assert "40 years old" not in stored and "Single-flight" not in stored
        assert f"offset {SF_NOTE.index('40 years old')}" in stored
        assert "40 years old" not in page.text and "was not kept" in page.text
        import sqlite3

        db = sqlite3.connect(s.folder / "audit.sqlite")
        dump = "\n".join(str(row) for row in db.execute("SELECT * FROM decisions"))
        assert "40 years old" not in dump and "Single-flight" not in dump
        # issue 22.11a: a keyed hash (HMAC under the store's 0600 secret), not a guessable SHA-256
        guessable = hashlib.sha256(b"40 years old").hexdigest()[:16]
        assert guessable not in dump and "[not kept: sha256:" not in stored
        assert "[not kept: hmac-sha256:" in stored and rec.json()["quote_hashing"] == "keyed"
        secret = s.folder / "audit_hash.key"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text().strip() not in dump
        # a row from before keyed hashing is read as it is, marked unkeyed (not rewritten)
        from verdict.serve.audit import AuditStore

        old = json.loads(re.sub(r"hmac-sha256:[0-9a-f]{8}:[0-9a-f]{16}", "sha256:" + guessable, stored))
        row = rec.json()
        store = AuditStore(s.folder / "audit.sqlite", store_notes=False)
        fields = ("trial_id", "program_hash", "patient_id", "patient_hash", "engine_version", "decision")
        before = store.add_decision(
            created_by="old", **{k: row[k] for k in fields}, note_hash=row["note_sha256"],
            policy_name=row["policy"]["name"], policy_version=row["policy"]["version"], models=row["models"],
            timings=row["timings_ms"], artifacts=old, note_text=None,
        )  # fmt: skip
        store.close()
        with s.client("admin") as admin:
            marked = admin.get(f"/v1/decisions/{before.decision_id}")
            old_page = admin.get(f"/v1/decisions/{before.decision_id}/page")
        assert marked.json()["quote_hashing"] == "unkeyed" and marked.json()["artifacts"] == old
        assert 'id="unkeyed"' in old_page.text and 'id="unkeyed"' not in page.text
    finally:
        s.stop()


# ---- items 8 and 9: errors carry no note fragments, the rationale no live markup -------------------
def test_formalizer_errors_never_pass_upstream_text(svc):
    with svc.client() as c:
        r = match(c, "T-AGE", SECRET_NOTE)
    assert r.status_code == 502, r.text
    assert NAME not in r.text and "Quorlin" not in r.text and "MRN" not in r.text
    assert "reference" in r.json()["message"] and "HTTP 400" in r.json()["message"]
    assert NAME not in svc.log


def test_markup_in_criteria_and_notes_is_escaped_in_the_rationale(svc):
    with svc.client("admin") as admin:
        prog = program(
            "T-XSS", "age_years", "Adults <script>alert(1)</script> ![x](http://evil.example/x.png)"
        )
        assert admin.post("/v1/trials", json={"program": prog}).status_code == 200
        r = match(admin, "T-XSS", MARKUP_NOTE)
    assert r.status_code == 200, r.text
    md = r.json()["rationale_markdown"]
    assert "<script" not in md and "<img" not in md and "](" not in md.replace("\\](", "")
    assert "&lt;script&gt;" in md and "&lt;img src=x onerror=alert(1)&gt;" in md


# ---- authentication -----------------------------------------------------------------------------------
def test_wrong_keys_are_locked_out_logged_and_refused_before_the_body(tmp_path, scripted):
    s = start_service(
        tmp_path / "lockout",
        scripted.url,
        CONFIG | {"auth": {"max_failures": 5, "window_s": 60, "lockout_s": 30}},
    )
    try:
        real = s.keys["match"]
        kid = real.split("_")[1]
        wrong = f"vk_{kid}_{'x' * 43}"
        with s.client(None) as anon:
            # unauthenticated and malformed: 401, not 422 (the body is not read)
            r = anon.post("/v1/match", content=b'{"trial_id": ', headers={"content-type": "application/json"})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            codes = [
                anon.get("/v1/trials/T", headers={"Authorization": f"Bearer {wrong}"}).status_code
                for _ in range(30)
            ]
            assert codes[:4] == [401] * 4 and set(codes[5:]) == {429}, codes
            locked = anon.get("/v1/trials/T", headers={"Authorization": f"Bearer {real}"})
            assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0
        log = s.log
        assert f"failed API key client=127.0.0.1 key_id={kid}" in log and "locked out" in log
        assert wrong.split("_", 2)[2] not in log and real.split("_", 2)[2] not in log
    finally:
        s.stop()


def test_a_stranger_naming_a_key_id_from_many_addresses_cannot_lock_that_key_out(svc):
    """Issue 22.3: key ids are public (pages, flags, audit records); lockout is by client address."""
    from verdict.serve.api_keys import KeyStore

    victim, entry = KeyStore(svc.folder / "keys.json").add("victim", ["audit"])
    guess = f"vk_{entry.id}_guess"
    with svc.client(None) as anon:
        for i in range(10):  # 10 addresses (uvicorn trusts X-Forwarded-For from 127.0.0.1)
            r = anon.get(
                "/v1/trials/T",
                headers={"Authorization": f"Bearer {guess}", "X-Forwarded-For": f"10.9.0.{i + 1}"},
            )
            assert r.status_code == 401, r.text
        r = anon.get(
            "/v1/trials/T", headers={"Authorization": f"Bearer {victim}", "X-Forwarded-For": "10.9.1.1"}
        )
    assert r.status_code == 404, r.text  # the real key works: not 429
    assert f"failed API key client=10.9.0.10 key_id={entry.id}" in svc.log


def test_the_service_log_names_patient_ids_so_it_is_private(svc):
    """Issue 22.11c: api.log_file was created world-readable (0644)."""
    assert stat.S_IMODE((svc.folder / "service.log").stat().st_mode) == 0o600


def test_a_key_without_the_route_role_is_refused_before_its_body_is_read(svc):
    """Issue 22 (fuzz): an audit key got 422 on malformed JSON and 403 only on well-formed input; a 413
    was logged with route `unmatched`; a JSON decode error named the decoder offset as a field."""
    broken = {"content": b'{"trial_id": "T",\n "patient": ', "headers": {"content-type": "application/json"}}
    from verdict.serve.api_config import Limits

    big = {"content": b"x" * (Limits().max_body_bytes + 1), "headers": {"content-type": "application/json"}}
    with svc.client("audit") as audit, svc.client("match") as c:
        for body in (broken, {"json": {"trial_id": 5}}, big):
            r = audit.post("/v1/match", **body)
            assert r.status_code == 403 and r.json()["error"] == "forbidden", r.text
        r = c.post("/v1/match", **broken)
        assert r.status_code == 422, r.text
        assert r.json()["message"] == "malformed JSON at line 2 column 13", r.text
        assert [p["field"] for p in r.json()["problems"]] == ["body"]
        assert c.post("/v1/match", **big).status_code == 413
    # the access log's line is written once the response has gone out: wait for it, not a clock
    wait_until(lambda: "POST /v1/match 413" in svc.log, "the 413's access-log line")
    assert "POST unmatched 413" not in svc.log


def test_keys_can_expire(tmp_path):
    from verdict.serve.api_keys import KeyStore

    store = KeyStore(tmp_path / "keys.json")
    key, entry = store.add("short", ["match"], expires_days=1.5 / 86400)
    assert entry.expires_at is not None and store.authenticate(key) is not None
    time.sleep(1.6)
    assert store.authenticate(key) is None


# ---- docs, headers, binding, the demo key ---------------------------------------------------------------
def test_docs_are_off_by_default_and_behind_a_key_when_on(svc, tmp_path, scripted):
    with svc.client(None) as anon, svc.client("audit") as a:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert anon.get(path).status_code == 401
            assert a.get(path).status_code == 404
    s = start_service(tmp_path / "docs", scripted.url, CONFIG | {"docs": True})
    try:
        with s.client(None) as anon, s.client("match") as c:
            assert anon.get("/openapi.json").status_code == 401
            assert c.get("/openapi.json").json()["paths"]
            assert c.get("/docs").status_code == 404  # no Swagger UI: it loads scripts from a CDN
    finally:
        s.stop()


def test_security_headers_on_every_response_and_no_server_banner(svc):
    with svc.client("admin") as admin, svc.client(None) as anon:
        m = match(admin, "T-AGE", SF_NOTE.replace("Single", "Headers"))
        responses = {
            "health": anon.get("/healthz"),
            "401": anon.get("/v1/trials/T-AGE"),
            "404": admin.get("/v1/trials/NOPE"),
            "match": m,
            "page": admin.get(m.json()["links"]["page"]),
        }
    for name, r in responses.items():
        h = r.headers
        assert "server" not in h, name
        assert h["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in h["content-security-policy"], (
            name
        )
        assert h["referrer-policy"] == "no-referrer" and h["x-content-type-options"] == "nosniff", name
        assert h["cache-control"] == "no-store", name
    csp = responses["page"].headers["content-security-policy"]
    assert "script-src" not in csp and "'unsafe-inline'" not in csp and "default-src 'none'" in csp


def test_a_warning_when_bound_beyond_loopback_without_tls(tmp_path, scripted):
    s = start_service(tmp_path / "public", scripted.url, CONFIG | {"host": "0.0.0.0"})
    try:
        assert "without TLS" in s.log
    finally:
        s.stop()


def test_the_demo_key_goes_to_a_private_file(tmp_path):
    from verdict.demo import write_key_file

    path = tmp_path / "demo-api-key"
    write_key_file(path, "vk_abcdefgh_secret")
    assert path.read_text().strip() == "vk_abcdefgh_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
