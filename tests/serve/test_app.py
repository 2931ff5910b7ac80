"""The matching API end to end with real parts: a CPU vLLM server with the tiny student and two
adapters trained (through `train/`) to memorize recorded teacher outputs, the service in front of
it as a real `verdict serve api` process, real HTTP, real Z3, a real headless Chromium.

The central claim: `/v1/match` on the recorded patients returns exactly the decisions the core
computes from the teacher records. The last test scans everything the services wrote.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest
from verdict.data_gen.formalizer.client import quotes_any
from verdict.serve.api_config import Limits

from tests.fixtures.vllm import teacher_programs, teacher_values, trial_text
from tests.serve.conftest import CHROMIUM, RunningService, launch_chromium, start_service
from tests.support import need

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# Every response body with an error status, for the final scan.
ERROR_BODIES: list[str] = []
SERVICES: list[RunningService] = []


def record_errors(r: httpx.Response) -> httpx.Response:
    if r.status_code >= 400:
        ERROR_BODIES.append(r.text)
    return r


@pytest.fixture(scope="module")
def svc(tmp_path_factory, vllm_server) -> RunningService:
    s = start_service(tmp_path_factory.mktemp("service"), vllm_server.base_url)
    SERVICES.append(s)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def trials(svc, student_records) -> dict[str, dict]:
    """Both recorded trials registered through the parser student."""
    out = {}
    with svc.client() as c:
        for t in student_records["trials"]:
            r = record_errors(
                c.post("/v1/trials", json={"text": trial_text(t).model_dump(exclude_none=True)})
            )
            assert r.status_code == 200, r.text
            out[t["trial_id"]] = r.json()
    return out


def core_decision(records: dict, trial_id: str, patient: dict, policy_name: str = "prescreen"):
    """What the core decides from the teacher records alone (no model, no service)."""
    from verdict.core.engine import Engine
    from verdict.core.policy import load_policy, resolve
    from verdict.core.rationale import render_markdown

    program = teacher_programs(records)[trial_id]
    values = teacher_values(records, program, patient, "inclusion") + teacher_values(
        records, program, patient, "exclusion"
    )
    # a single `note` is the one document 'note': every observed value's quote names it
    sources = {v.atom: "note" for v in values if v.value is not None or v.bounds is not None}
    resolved = resolve(program, patient["patient_id"], values, load_policy(policy_name), sources=sources)
    d = Engine(timeout_ms=5000, alternatives=2).decide(program, resolved)
    return program, resolved, d, render_markdown(program, resolved, d)


def match_body(trial_id: str, patient: dict, **extra) -> dict:
    return {
        "trial_id": trial_id,
        "patient": {"patient_id": patient["patient_id"], "note": patient["note"]},
        **extra,
    }


# ---- health, auth ----------------------------------------------------------------------------------
def test_health_needs_no_key_and_readiness_checks_the_adapters(svc):
    with svc.client(None) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json()["ready"] is True
        assert {"base", "parser", "value_miner"} <= set(r.json()["models"])


def test_every_other_route_needs_a_key_with_its_role(svc):
    routes = [
        ("GET", "/metrics"),
        ("POST", "/v1/trials"),
        ("GET", "/v1/trials/x"),
        ("POST", "/v1/match"),
        ("POST", "/v1/match/batch"),
        ("GET", "/v1/decisions/x"),
        ("GET", "/v1/decisions/x/page"),
    ]
    with svc.client(None) as anon, svc.client(None) as forged:
        forged.headers["Authorization"] = "Bearer vk_deadbeef_not-a-real-key"
        for method, path in routes:
            for c in (anon, forged):
                r = record_errors(c.request(method, path, json={}))
                assert r.status_code == 401, (method, path, r.text)
                assert r.json()["error"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
    with svc.client("audit") as auditor, svc.client("match") as matcher:
        assert record_errors(auditor.post("/v1/match", json={})).status_code == 403
        assert record_errors(matcher.get("/v1/decisions/x")).status_code == 403
        assert record_errors(matcher.get("/metrics")).status_code == 403
        # X-API-Key works as well as a bearer token
        assert httpx.get(svc.url + "/metrics", headers={"X-API-Key": svc.keys["audit"]}).status_code == 200


# ---- trials ----------------------------------------------------------------------------------------
def test_trials_are_parsed_once_into_the_teacher_programs(svc, trials, student_records):
    programs = teacher_programs(student_records)
    with svc.client() as c:
        for t in student_records["trials"]:
            first = trials[t["trial_id"]]
            assert first["origin"] == "parser" and first["parser_model"] == "parser"
            assert first["program_hash"] == programs[t["trial_id"]].content_hash  # the student reproduced it
            again = c.post("/v1/trials", json={"text": trial_text(t).model_dump(exclude_none=True)}).json()
            assert again["cached"] is True and again["program_hash"] == first["program_hash"]
            got = c.get(f"/v1/trials/{t['trial_id']}").json()
            assert got["program"]["content_hash"] == first["program_hash"]
        r = record_errors(c.get("/v1/trials/NCT-NOPE"))
        assert r.status_code == 404 and "POST /v1/trials" in r.json()["message"]
    with svc.client("audit") as a:
        metrics = a.get("/metrics").text
    assert 'verdict_trial_cache_total{result="miss"} 2.0' in metrics
    assert 'verdict_trial_cache_total{result="hit"}' in metrics


# ---- matching --------------------------------------------------------------------------------------
def test_match_returns_the_decisions_the_core_computes_from_the_teacher_records(svc, trials, student_records):
    seen = set()
    with svc.client() as c, svc.client("audit") as a:
        for t in student_records["trials"]:
            for p in student_records["patients"]:
                r = record_errors(c.post("/v1/match", json=match_body(t["trial_id"], p)))
                assert r.status_code == 200, r.text
                body = r.json()
                program, resolved, expected, markdown = core_decision(student_records, t["trial_id"], p)
                assert body["decision"] == json.loads(expected.canonical_json()), (
                    t["trial_id"],
                    p["patient_id"],
                )
                assert body["patient"] == resolved.model_dump(mode="json")
                assert body["rationale_markdown"] == markdown
                assert body["program_hash"] == program.content_hash and body["trial_cached"] is True
                assert (
                    body["models"]["value_miner"] == "value_miner" and body["models"]["base_model"] == "base"
                )
                assert {"value_miner", "resolve", "solve", "render", "total"} <= set(body["timings_ms"])
                seen.add(body["decision"]["decision"])
                # the audit store has the same decision, with what reproduces it
                rec = a.get(body["links"]["decision"]).json()
                assert rec["decision"] == expected.decision and rec["program_hash"] == program.content_hash
                assert rec["policy"] == {"name": "prescreen", "version": "1"} and rec["note_stored"] is True
                assert rec["artifacts"]["decision"] == body["decision"]
                assert rec["models"]["parser"] == "parser"
                assert rec["created_by"] == svc.keys["match"].split("_")[1]  # the caller's key id
    assert seen == {"eligible", "ineligible"}


def test_inline_trial_text_and_another_policy(svc, trials, student_records):
    t, p = student_records["trials"][1], student_records["patients"][1]  # P2 on the kidney trial
    with svc.client() as c:
        body = {
            "trial": trial_text(t).model_dump(exclude_none=True),
            "patient": {"patient_id": p["patient_id"], "note": p["note"]},
            "policy": "exclusion-absent",
        }
        r = record_errors(c.post("/v1/match", json=body))
    assert r.status_code == 200, r.text
    _, _, expected, _ = core_decision(student_records, t["trial_id"], p, "exclusion-absent")
    assert r.json()["trial_cached"] is True  # the same text was parsed before: no parser call
    assert r.json()["decision"] == json.loads(expected.canonical_json())
    assert r.json()["policy"]["name"] == "exclusion-absent"


def test_batch_streams_every_pair_as_it_finishes(svc, trials, student_records):
    patients = [{"patient_id": p["patient_id"], "note": p["note"]} for p in student_records["patients"]]
    tids = [t["trial_id"] for t in student_records["trials"]]
    lines = []
    with svc.client() as c:
        with c.stream("POST", "/v1/match/batch", json={"patients": patients, "trial_ids": tids}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
            for line in r.iter_lines():
                if line:
                    lines.append(json.loads(line))
        assert sorted(x["index"] for x in lines) == list(range(len(patients) * len(tids)))
        for x in lines:
            assert x["status"] == 200, x
            p = next(q for q in student_records["patients"] if q["patient_id"] == x["patient_id"])
            _, _, expected, _ = core_decision(student_records, x["trial_id"], p)
            assert x["result"]["decision"] == json.loads(expected.canonical_json())
        # nothing starts when part of the batch is invalid
        r = record_errors(
            c.post("/v1/match/batch", json={"patients": patients, "trial_ids": [tids[0], "NCT-NOPE"]})
        )
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "trial_ids.1"


def test_uploaded_reviewed_program_supersedes_the_parsed_one(svc, trials, student_records):
    t, p1 = student_records["trials"][0], student_records["patients"][0]
    program = json.loads(json.dumps(trials[t["trial_id"]]["program"]))
    program["cohorts"][0]["inclusion"][0]["formula"]["rhs"] = 60  # reviewer: age 60 or older
    program["cohorts"][0]["inclusion"][0]["text"] = "Age 60 years or older"
    program.pop("content_hash")
    with svc.client("match") as c, svc.client("admin") as admin:
        assert record_errors(c.post("/v1/trials", json={"program": program})).status_code == 403
        r = admin.post("/v1/trials", json={"program": program})
        assert r.status_code == 200 and r.json()["origin"] == "upload"
        new_hash = r.json()["program_hash"]
        assert c.get(f"/v1/trials/{t['trial_id']}").json()["program_hash"] == new_hash
        old = c.get(
            f"/v1/trials/{t['trial_id']}", params={"program_hash": trials[t["trial_id"]]["program_hash"]}
        )
        assert old.json()["origin"] == "parser"
        m = c.post("/v1/match", json=match_body(t["trial_id"], p1)).json()
        assert m["program_hash"] == new_hash and m["decision"]["decision"] == "ineligible"  # 58 < 60
        # the superseded (parsed) version: refused to a match key, naming the active one (issue 22.5);
        # a trial owner may still match against it, as a preview marked on the decision
        body = match_body(t["trial_id"], p1, program_hash=trials[t["trial_id"]]["program_hash"])
        refused = c.post("/v1/match", json=body)
        assert refused.status_code == 409 and new_hash in refused.text, refused.text
        pinned = admin.post("/v1/match", json=body).json()
        assert pinned["decision"]["decision"] == "eligible" and pinned["trial_version"]["use"] == "preview"
        # an invalid program is refused naming every problem
        bad = json.loads(json.dumps(program))
        bad["cohorts"][0]["exclusion"][0]["formula"] = "not_declared_atom"
        r = record_errors(admin.post("/v1/trials", json={"program": bad}))
        assert r.status_code == 422 and "undeclared atom 'not_declared_atom'" in r.text


# ---- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body,fields",
    [
        ({"patient": {"patient_id": "P1", "note": "x"}}, ["body"]),
        (
            {
                "trial_id": "T",
                "patient": {"patient_id": "bad id!", "note": ""},
                "policy": "../etc/passwd",
                "x": 1,
            },
            ["patient.patient_id", "patient.note", "policy", "x"],
        ),
        ({"trial_id": "T", "patient": {"patient_id": "P1", "note": "x" * 100_001}}, ["patient.note"]),
        ({"trial": {"title": "no text"}, "patient": {"patient_id": "P1", "note": "x"}}, ["trial"]),
    ],
)
def test_invalid_requests_are_422_naming_every_invalid_field(svc, body, fields):
    with svc.client() as c:
        r = record_errors(c.post("/v1/match", json=body))
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    assert sorted({p["field"] for p in r.json()["problems"]}) == sorted(fields)


def test_other_bad_input(svc, trials, student_records):
    p = student_records["patients"][0]
    with svc.client() as c:
        r = record_errors(c.post("/v1/match", json=match_body("NCT-DM-01", p, policy="no-such-policy")))
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "policy"
        r = record_errors(
            c.post("/v1/match", content=b'{"trial_id": ', headers={"content-type": "application/json"})
        )
        assert r.status_code == 422
        r = record_errors(
            c.post(
                "/v1/match",
                content=b"x" * (Limits().max_body_bytes + 1),
                headers={"content-type": "application/json"},
            )
        )
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
        r = record_errors(c.post("/v1/match", json=match_body("NCT-NOPE", p)))
        assert r.status_code == 404 and r.json()["problems"] == [
            {"field": "trial_id", "message": "unknown trial"}
        ]
        r = record_errors(c.post("/v1/trials", json={"ctgov_study": {"protocolSection": {}}}))
        assert r.status_code == 422 and r.json()["problems"][0]["field"] == "ctgov_study"


# ---- the clinician page, in a real browser ----------------------------------------------------------
def test_clinician_page_in_headless_chromium(svc, trials, student_records):
    need(CHROMIUM.exists(), "Chromium missing: apt-get install -y chromium")
    playwright = pytest.importorskip("playwright.sync_api")
    t, p = student_records["trials"][0], student_records["patients"][0]  # P1 eligible for the diabetes trial
    # the parsed version (a reviewer's upload may have superseded it: then matched as a preview,
    # which a trial owner may do)
    with svc.client("admin") as c:
        m = c.post(
            "/v1/match", json=match_body(t["trial_id"], p, program_hash=trials[t["trial_id"]]["program_hash"])
        ).json()
    with playwright.sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            ctx = browser.new_context(extra_http_headers={"Authorization": f"Bearer {svc.keys['audit']}"})
            page = ctx.new_page()
            resp = page.goto(svc.url + m["links"]["page"])
            assert resp.status == 200
            assert page.locator("#decision").inner_text().lower() == "eligible"
            rows = page.locator("#criteria tbody tr")
            assert rows.count() == 3
            assert page.locator("tr[data-criterion='inc-1'] td").nth(2).inner_text() == "met"
            assert page.locator("tr[data-criterion='exc-1'] td").nth(2).inner_text() == "does not apply"
            marks = [page.locator("mark").nth(i).inner_text() for i in range(page.locator("mark").count())]
            assert marks == ["58-year-old", "type 2 diabetes", "Postmenopausal"]  # in note order
            assert page.locator("#note").inner_text().strip() == p["note"]
            page.locator(
                "tr[data-criterion='inc-2'] a"
            ).click()  # evidence link jumps to the mark in the note
            assert page.evaluate("location.hash") == "#ev-1"
            assert page.get_by_role("heading", name="What would make the patient ineligible").count() == 1
            assert page.locator("#change li").count() >= 1
            assert page.locator("#confirm li").count() >= 1
            page.screenshot(path=str(svc.folder / "decision-page.png"))
            # an auditor's key is needed: the same page without it is refused
            anon = browser.new_context().new_page()
            assert anon.goto(svc.url + m["links"]["page"]).status == 401
        finally:
            browser.close()


# ---- failure behaviour -----------------------------------------------------------------------------
def _audit_counts(folder: Path) -> tuple[int, int]:
    db = sqlite3.connect(folder / "audit.sqlite")
    return db.execute("SELECT COUNT(*) FROM trials").fetchone()[0], db.execute(
        "SELECT COUNT(*) FROM decisions"
    ).fetchone()[0]


def test_formalizer_down_is_503_with_retry_after_and_nothing_written(tmp_path, student_records):
    from verdict.serve.vllm.server import free_port

    s = start_service(tmp_path / "down", f"http://127.0.0.1:{free_port()}/v1", {"retry_after_s": 7})
    SERVICES.append(s)
    try:
        t, p = student_records["trials"][0], student_records["patients"][0]
        with s.client() as c:
            for path, body in (
                ("/v1/trials", {"text": trial_text(t).model_dump(exclude_none=True)}),
                (
                    "/v1/match",
                    {
                        "trial": trial_text(t).model_dump(exclude_none=True),
                        "patient": {"patient_id": "P1", "note": p["note"]},
                    },
                ),
            ):
                r = record_errors(c.post(path, json=body))
                assert r.status_code == 503 and r.headers["retry-after"] == "7", r.text
                assert r.json()["error"] == "formalizer_unavailable"
        with s.client(None) as c:
            assert c.get("/readyz").status_code == 503
        assert _audit_counts(s.folder) == (0, 0)
    finally:
        s.stop()


def test_formalizer_slow_is_503(tmp_path, vllm_server, student_records):
    s = start_service(tmp_path / "slow", vllm_server.base_url, {"formalizer": {"timeout_s": 0.05}})
    SERVICES.append(s)
    try:
        with s.client() as c:
            r = record_errors(
                c.post(
                    "/v1/trials",
                    json={"text": trial_text(student_records["trials"][0]).model_dump(exclude_none=True)},
                )
            )
        assert (
            r.status_code == 503 and "retry-after" in r.headers and "no answer within" in r.json()["message"]
        )
        assert _audit_counts(s.folder) == (0, 0)
    finally:
        s.stop()


def test_invalid_model_output_is_502_after_one_repair(tmp_path, vllm_server, student_records):
    """The untrained base model as the parser: schema-valid JSON (xgrammar) that fails the checks."""
    s = start_service(
        tmp_path / "bad",
        vllm_server.base_url,
        {"formalizer": {"parser_model": "base", "max_tokens": {"parser": 64}}},
    )
    SERVICES.append(s)
    try:
        with s.client() as c:
            r = record_errors(
                c.post(
                    "/v1/trials",
                    json={"text": trial_text(student_records["trials"][0]).model_dump(exclude_none=True)},
                )
            )
        assert r.status_code == 502, r.text
        body = r.json()
        assert body["error"] == "formalizer_output_invalid" and "after one repair attempt" in body["message"]
        assert body["problems"] and all(p["field"] == "parse" for p in body["problems"])
        with s.client("audit") as a:
            assert (
                'verdict_formalizer_repairs_total{outcome="rejected",stage="parse"} 1.0'
                in a.get("/metrics").text
            )
        assert _audit_counts(s.folder) == (0, 0)
    finally:
        s.stop()


def test_refuses_to_start_when_the_formalizer_is_not_on_the_allowlist(tmp_path):
    s = start_service(tmp_path / "egress", "http://10.20.30.40:8000/v1", wait=False)
    assert s.process.wait(timeout=60) == 2
    err = (s.folder / "stderr.txt").read_text()
    assert "refusing to start" in err and "10.20.30.40" in err and "Traceback" not in err
    ok = start_service(
        tmp_path / "egress-ok", "http://10.20.30.40:8000/v1", {"egress": {"allow_hosts": ["10.20.30.0/24"]}}
    )
    SERVICES.append(ok)
    ok.stop()


# ---- metrics, and what the services wrote ----------------------------------------------------------
def test_metrics_count_requests_stages_tokens_and_decisions(svc, trials):
    with svc.client("audit") as a:
        text = a.get("/metrics").text
    for needle in (
        'verdict_requests_total{method="POST",route="/v1/match",status="200"}',
        'verdict_stage_seconds_count{stage="miner_inclusion"}',
        'verdict_stage_seconds_count{stage="solve"}',
        'verdict_formalizer_tokens_total{kind="completion",stage="parse"}',
        'verdict_decisions_total{decision="eligible"}',
        'verdict_errors_total{code="unauthorized"}',
    ):
        assert needle in text, needle
    assert "/v1/decisions/dec_" not in text  # route templates, never concrete paths


def test_no_patient_text_in_anything_the_services_wrote(svc, vllm_server, student_records):
    """Last: notes went through every path above; none of their text may be in a log, the metrics or an
    error body (the audit store is the one place that keeps notes, by design)."""
    notes = tuple(p["note"] for p in student_records["patients"])
    with svc.client("audit") as a:
        scraped = [a.get("/metrics").text]
    texts = {str(f): f.read_text(errors="replace") for s in SERVICES for f in s.written if f.exists()}
    texts[str(vllm_server.log_path)] = vllm_server.log_path.read_text(errors="replace")
    texts["metrics"] = scraped[0]
    for i, body in enumerate(ERROR_BODIES):
        texts[f"error body {i}"] = body
    assert len(texts) >= 8 and ERROR_BODIES
    leaks = [name for name, text in texts.items() if quotes_any(text, notes, window=16)]
    assert leaks == []
