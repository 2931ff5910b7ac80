"""Schemathesis over the service's OpenAPI: generated requests on every operation (valid and
invalid), with zero 5xx responses and every response conforming to the documented schema.

The formalizer here is the project's scripted OpenAI-compatible server (real HTTP): it answers any
criteria with a valid program and any note with valid (null) values, so that every 5xx would be the
service's own fault. The students' real behaviour on real requests is covered by test_app.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer

from tests.serve.conftest import start_service
from tests.serve.test_serving import EXCLUSION, INCLUSION  # the scripted per-criterion parser answers


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    srv = ScriptedServer(
        Script.model_validate(
            {
                "rules": [
                    {"match": {"contains": ["Patient note"]}, "responses": [{"auto": "nulls"}]},
                    # a satisfiable program whatever the criteria: adults, excluded with chest pain
                    {
                        "match": {"contains": ["Exclusion criterion:\n"]},
                        "responses": [{"content": EXCLUSION}],
                    },
                ],
                "default": {"content": INCLUSION},
            }
        )
    ).start()
    s = start_service(
        tmp_path_factory.mktemp("openapi-service"),
        srv.url,
        {
            "formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"},
            "solver_timeout_ms": 2000,
            "docs": True,  # /openapi.json, behind a key
        },
    )
    yield s
    s.stop()
    srv.stop()


def test_openapi_documents_every_route_and_the_key(svc):
    with svc.client(None) as anon:
        assert anon.get("/openapi.json").status_code == 401
    with svc.client("audit") as c:
        spec = c.get("/openapi.json").json()
    assert {
        "/v1/trials",
        "/v1/trials/{trial_id}",
        "/v1/match",
        "/v1/match/batch",
        "/v1/decisions/{decision_id}",
        "/v1/decisions/{decision_id}/page",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert set(spec["paths"]["/v1/match"]["post"]["responses"]) >= {"200", "401", "422", "502", "503"}


@pytest.mark.slow
def test_schemathesis_finds_no_server_errors(svc, tmp_path):
    # Register one trial, so that generated trial ids sometimes hit a real one.
    with svc.client("admin") as c:
        assert (
            c.post("/v1/trials", json={"text": {"trial_id": "T1", "criteria": "Adults."}}).status_code == 200
        )
    exe = Path(sys.executable).with_name("schemathesis")
    report = tmp_path / "report.json"
    schema = tmp_path / "openapi.json"
    with svc.client("admin") as c:
        schema.write_text(c.get("/openapi.json").text)  # the schema needs a key: read it first
    cmd = [
        str(exe),
        "run",
        str(schema),
        "--url",
        svc.url,
        "--header",
        f"Authorization: Bearer {svc.keys['admin']}",
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_schema_conformance,response_headers_conformance",
        "--max-examples",
        "50",
        "--seed",
        "7",
        "--workers",
        "1",
        "--phases",
        "examples,coverage,fuzzing",
        "--request-timeout",
        "60",
        "--generation-database",
        "none",
        "--suppress-health-check",
        "all",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    with svc.client("audit") as a:
        metrics = a.get("/metrics").text
    statuses = {}
    for line in metrics.splitlines():
        if line.startswith("verdict_requests_total{"):
            status = line.split('status="')[1].split('"')[0]
            statuses[status] = statuses.get(status, 0) + float(line.rsplit(" ", 1)[1])
    assert not [s for s in statuses if s.startswith("5")], statuses
    assert sum(statuses.values()) > 200 and statuses.get("200", 0) > 20 and statuses.get("422", 0) > 20
    assert "internal error" not in svc.log
    json.loads(report.read_text())  # the report is there for a failed run's post-mortem
