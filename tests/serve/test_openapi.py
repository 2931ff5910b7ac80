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
        "/v1/decisions/{decision_id}/rereads",
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


# ---- the document's contract (issue 22, "What a schema-driven fuzz found") --------------------------
def spec_of(svc) -> dict:
    with svc.client("audit") as c:
        return c.get("/openapi.json").json()


def refs(node, where="#"):
    """Every ($ref, where it is) in a JSON document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v, where
            else:
                yield from refs(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from refs(v, f"{where}/{i}")


def test_every_ref_in_the_document_resolves_against_its_root(svc):
    spec = spec_of(svc)
    found = list(refs(spec))
    assert len(found) > 100
    for ref, where in found:
        assert ref.startswith("#/components/schemas/"), (ref, where)
        assert ref.removeprefix("#/components/schemas/") in spec["components"]["schemas"], (ref, where)
    assert "$defs" not in json.dumps(spec)
    # the stream's lines: one BatchLine per line, the model under components like every other
    responses = spec["paths"]["/v1/match/batch"]["post"]["responses"]
    assert responses["200"]["content"] == {
        "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/BatchLine"}}
    }
    assert responses["422"]["content"] == {  # its errors are JSON, as every route's
        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}
    }


def validator(spec: dict, name: str):
    import jsonschema

    # the document is the root, so that its `#/components/schemas/...` references resolve
    return jsonschema.Draft202012Validator({**spec, "$ref": f"#/components/schemas/{name}"})


NOTE = {"patient_id": "p1", "note": "45 years old."}
REREAD = "/v1/decisions/dec_none/rereads"
# (route, schema, body, valid by the document): the server must agree with the document on each
EXAMPLES = [
    ("/v1/trials", "TrialRequest", {"program": {}}, False),
    ("/v1/trials", "TrialRequest", {}, False),
    ("/v1/trials", "TrialRequest", {"text": {"criteria": "Adults."}, "program": None}, True),
    ("/v1/trials", "TrialRequest", {"text": {"criteria": "Adults.", "inclusion": "Adults."}}, False),
    ("/v1/trials", "TrialRequest", {"text": {"title": "no criteria"}}, False),
    ("/v1/trials", "TrialRequest", {"ctgov_study": {}}, False),
    (  # its NCT id becomes the trial id: a 422 naming ctgov_study (it was a 502 from the parser's check)
        "/v1/trials",
        "TrialRequest",
        {
            "ctgov_study": {
                "protocolSection": {
                    "identificationModule": {"nctId": "NCT 01"},
                    "eligibilityModule": {"eligibilityCriteria": "Adults."},
                }
            }
        },
        False,
    ),
    ("/v1/match", "MatchRequest", {"trial_id": "T-none", "patient": NOTE}, True),
    ("/v1/match", "MatchRequest", {"trial_id": "T-none", "patient": {**NOTE, "notes": None}}, True),
    (
        "/v1/match",
        "MatchRequest",
        {"trial_id": "T-none", "patient": {**NOTE, "notes": [{"id": "d1", "text": "45 years old."}]}},
        False,
    ),
    ("/v1/match", "MatchRequest", {"trial_id": "T-none", "patient": {"patient_id": "p1"}}, False),
    (
        "/v1/match",
        "MatchRequest",
        {"trial_id": "T-none", "trial": {"criteria": "Adults."}, "patient": NOTE},
        False,
    ),
    (
        "/v1/match",
        "MatchRequest",
        {"trial": {"criteria": "Adults."}, "program_hash": "sha256:" + "0" * 64, "patient": NOTE},
        False,
    ),
    ("/v1/screen", "ScreenRequest", {"patient": NOTE, "trial_id": "T-none"}, False),
    (
        "/v1/screen",
        "ScreenRequest",
        {"trial_id": "T-none", "patients": [NOTE], "trial_ids": ["T-none"]},
        False,
    ),
    ("/v1/screen", "ScreenRequest", {"patients": [NOTE]}, False),
    # a re-read: atoms, or complete, or both (unknown decision: a 404, not a 422)
    (REREAD, "RereadRequest", {"atoms": ["is_pregnant"], "reason": "r"}, True),
    (REREAD, "RereadRequest", {"complete": True, "atoms": None, "reason": "r", "patient": NOTE}, True),
    (REREAD, "RereadRequest", {"complete": False, "reason": "r"}, False),
    (REREAD, "RereadRequest", {"atoms": ["a", "a"], "reason": "r"}, False),
    (REREAD, "RereadRequest", {"atoms": ["a"], "reason": " "}, False),
]


@pytest.mark.parametrize("route,schema,body,valid", EXAMPLES, ids=lambda x: json.dumps(x)[:60])
def test_the_document_states_the_rules_the_service_checks(svc, route, schema, body, valid):
    spec = spec_of(svc)
    problems = [e.message for e in validator(spec, schema).iter_errors(body)]
    assert (not problems) == valid, problems
    with svc.client("admin") as c:
        r = c.post(route, json=body)
    if valid:  # accepted, or refused for the server's state (an unknown trial), not for its shape
        assert r.status_code != 422 or not r.json()["message"].startswith("invalid request"), r.text
    else:
        assert r.status_code == 422, r.text  # by request validation, or the program's check


# A request-validation 422 of a schema-valid request must name a rule the document lists under
# `x-also-checked` (rules JSON Schema cannot state): server message fragment -> the listed rule's words.
ALSO_CHECKED = {
    "must equal `patient_id`": "`fhir.patient_id` equals `patient_id`",
    "duplicate document id": "document ids are unique",
    "duplicate patient_id": "each patient_id at most once",
    "characters in all": "characters in all",
    "`fhir.birth_date` is not a date": "are calendar dates",
    "`fhir.reference_date` is not an ISO date": "are calendar dates",
    "plausible dates": "plausible reference date",
    "do not match `fhir.birth_date`": "are the age they give",
    "a fhir_server label": "a fhir_server `label` is the server's base URL",
}


def also_checked(spec: dict, name: str, seen=None) -> list[str]:
    """The x-also-checked rules of a schema and of every schema it references."""
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    schema = spec["components"]["schemas"][name]
    out = list(schema.get("x-also-checked", []))
    for ref, _ in refs(schema):
        out += also_checked(spec, ref.removeprefix("#/components/schemas/"), seen)
    return out


@pytest.mark.parametrize(
    "route,schema",
    [
        ("/v1/match", "MatchRequest"),
        ("/v1/match/batch", "BatchRequest"),
        ("/v1/screen", "ScreenRequest"),
        ("/v1/decisions/{decision_id}/rereads", "RereadRequest"),
    ],
)
def test_schema_valid_requests_are_refused_only_by_rules_the_document_states(svc, route, schema):
    """Requests drawn from the document (schemathesis, positive data only, a bounded sample) are never
    refused by request validation for a rule the document does not state."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, assume, given, settings
    from schemathesis.generation import GenerationMode

    spec = spec_of(svc)
    listed = also_checked(spec, schema)
    strategy = schemathesis.openapi.from_dict(spec)[route]["POST"].as_strategy(
        generation_mode=GenerationMode.POSITIVE
    )
    outcomes = {"passed validation": 0, "refused by a listed rule": 0}
    with svc.client("admin", timeout=60) as c:

        @settings(
            max_examples=20,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def check(case):
            # valid by the document as Python reads its patterns (as the server does; a generator may not)
            assume(not list(validator(spec, schema).iter_errors(case.body)))
            r = c.post(route, json=case.body)
            if r.status_code != 422 or not r.json()["message"].startswith("invalid request"):
                outcomes["passed validation"] += 1  # then accepted, or refused for the server's state
                return
            for p in r.json()["problems"]:
                rule = next((rule for frag, rule in ALSO_CHECKED.items() if frag in p["message"]), None)
                assert rule is not None and any(rule in text for text in listed), (
                    f"a schema-valid request was refused by a rule the document does not state: {p}; "
                    "state it in the schema (serve/contract.py) or under x-also-checked"
                )
            outcomes["refused by a listed rule"] += 1

        check()
    assert outcomes["passed validation"] > 0, outcomes
