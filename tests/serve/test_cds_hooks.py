"""The CDS Hooks 2.0 service (`/cds-services`) over real HTTP: a `verdict serve api` process, the
scripted formalizer (real HTTP) answering the queued screenings, JWTs signed with a real ES384 key
and verified by the service against its JWKS file. Every request and answer is checked against the
vendored CDS Hooks OpenAPI description (tests/fixtures/cds_hooks/, README there).

One service for the module: the patient is unknown first (no card, a screening queued), then its
cards come ranked as a screen ranks; feedback on them reaches the audit chain and the trial's flags;
a real browser opens a card's link, signs in, and lands on the decision's page.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path

import httpx
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from verdict.core.decision import Decision
from verdict.core.ranking import rank
from verdict.data_gen.scripted_server import Script, ScriptedServer
from verdict.serve.api_keys import KeyStore

from tests.fixtures.postgres import free_port
from tests.serve.conftest import CHROMEDRIVER, CHROMIUM, selenium_chromium, start_service
from tests.serve.test_screen import NOTE_40, SCRIPT, TRIALS
from tests.support import need

SPEC = yaml.safe_load((Path(__file__).parents[1] / "fixtures/cds_hooks/cds-hooks.yaml").read_text())
ISSUER = "https://ehr.site.example"
SERVICE = "verdict-trial-matches"
RANKED = ["T-ELIGIBLE", "T-CONFIRM", "T-MISS1", "T-MISS2"]  # the patient of NOTE_40, as a screen ranks
SCREENS = Path("/tmp/verdict_screens")


def schema_check(name: str, instance) -> None:
    """`instance` fits components/schemas/NAME of the vendored description (every error listed)."""
    import jsonschema

    validator = jsonschema.Draft7Validator({"$ref": f"#/components/schemas/{name}", **SPEC})
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(instance)]
    assert errors == [], (name, errors)


class Ehr:
    """The EHR's signing key and what it signs its calls with."""

    def __init__(self, folder: Path, kid: str = "ehr-key-1"):
        self.key = ec.generate_private_key(ec.SECP384R1())
        self.kid = kid
        jwk = jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        self.jwks = folder / "ehr-jwks.json"
        self.jwks.write_text(json.dumps({"keys": [{**jwk, "kid": kid, "use": "sig", "alg": "ES384"}]}))

    def token(self, aud: str, **claims) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": aud, "exp": now + 300, "iat": now, "jti": uuid.uuid4().hex, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.key, algorithm="ES384", headers={"kid": self.kid})


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cds-hooks")
    ehr = Ehr(folder)
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    svc = start_service(
        folder / "service",
        srv.url,
        {
            "port": port,
            "public_url": public,
            "formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"},
            "cds_hooks": {"clients": [{"name": "ehr", "issuer": ISSUER, "jwks_file": str(ehr.jwks)}]},
        },
    )
    svc.keys["review"] = KeyStore(svc.folder / "keys.json").add("dr-review", ["review"])[0]
    try:
        svc.upload(*TRIALS[:4])
        yield svc, srv, ehr, public
    finally:
        svc.stop()
        srv.stop()


def call(svc, ehr, public, path: str, body=None, token: str | None = "sign"):
    """A hook call as the EHR makes it: signed for `public` + path (a fresh jti each time)."""
    headers = {}
    if token == "sign":
        token = ehr.token(public)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(base_url=svc.url, timeout=60, trust_env=False) as c:
        if body is None:
            return c.get(path, headers=headers)
        return c.post(path, json=body, headers=headers)


def prefetch(pid: str, note: str) -> dict:
    document = {
        "resourceType": "DocumentReference",
        "id": f"doc-{pid}",
        "status": "current",
        "subject": {"reference": f"Patient/{pid}"},
        "date": "2025-01-10T09:00:00Z",
        "content": [
            {"attachment": {"contentType": "text/plain", "data": base64.b64encode(note.encode()).decode()}}
        ],
    }
    return {
        "patient": {"resourceType": "Patient", "id": pid, "gender": "male"},
        "documents": {"resourceType": "Bundle", "type": "searchset", "entry": [{"resource": document}]},
    }


def hook_request(pid: str, **extra) -> dict:
    body = {
        "hook": "patient-view",
        "hookInstance": str(uuid.uuid4()),
        "context": {"userId": "Practitioner/dr-1", "patientId": pid},
        "prefetch": prefetch(pid, NOTE_40),
        **extra,
    }
    schema_check("CdsRequest", body)
    return body


def cards_when_screened(
    svc, ehr, public, pid: str, body: dict | None = None, want: int = len(RANKED)
) -> list[dict]:
    """The patient's cards once its queued screening has recorded its decisions (polled: the order of
    events is what is checked, not how long they take)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        r = call(
            svc,
            ehr,
            public,
            f"/cds-services/{SERVICE}",
            {**(body or hook_request(pid)), "hookInstance": str(uuid.uuid4())},
        )
        assert r.status_code == 200, r.text
        if len(r.json()["cards"]) >= want:
            return r.json()["cards"]
        time.sleep(0.5)
    raise AssertionError(f"no cards for {pid} after its screening: {r.json()}")


@pytest.fixture(scope="module")
def screened(hooks):
    """The cards of a patient after the first call queued its screening (and nothing before)."""
    svc, srv, ehr, public = hooks
    first = call(svc, ehr, public, f"/cds-services/{SERVICE}", hook_request("p40"))
    assert first.status_code == 200, first.text
    assert first.json() == {"cards": []}
    schema_check("CdsResponse", first.json())
    return cards_when_screened(svc, ehr, public, "p40")


def test_discovery_lists_the_patient_view_service(hooks):
    svc, _, ehr, public = hooks
    r = call(svc, ehr, public, "/cds-services")
    assert r.status_code == 200, r.text
    schema_check("CdsServiceInformation", r.json())
    (service,) = r.json()["services"]
    assert service["hook"] == "patient-view" and service["id"] == SERVICE
    assert service["prefetch"]["patient"] == "Patient/{{context.patientId}}"
    # an API key is not a hook client's credential
    with svc.client("admin") as c:
        assert c.get("/cds-services").status_code == 401


def test_every_jwt_defect_is_refused_with_a_401_naming_it(hooks, tmp_path):
    svc, _, ehr, public = hooks
    stranger = Ehr(tmp_path, kid=ehr.kid)  # another key under the EHR's kid: a forged signature
    replayed = ehr.token(public)
    assert call(svc, ehr, public, "/cds-services", token=replayed).status_code == 200
    now = int(time.time())
    cases = {
        "missing JWT": None,
        "malformed JWT": "not.a.jwt",
        "unknown issuer": ehr.token(public, iss="https://other-ehr.example"),
        "wrong audience": ehr.token("https://verdict.elsewhere.example"),
        "expired JWT": ehr.token(public, exp=now - 600, iat=now - 900),
        "no 'jti' claim": ehr.token(public, jti=None),
        "no 'exp' claim": ehr.token(public, exp=None),
        "bad signature": stranger.token(public),
        "replayed JWT": replayed,
    }
    body = hook_request("p-refused")
    for problem, token in cases.items():
        for path, payload in (("/cds-services", None), (f"/cds-services/{SERVICE}", body)):
            r = call(svc, ehr, public, path, payload, token=token)
            assert r.status_code == 401, (problem, path, r.status_code, r.text)
            assert problem in r.json()["message"], (problem, r.json())
            assert r.headers["www-authenticate"].startswith("Bearer")
    # a refused call's body is never read: a malformed one still gets the 401
    with httpx.Client(base_url=svc.url, timeout=30, trust_env=False) as c:
        r = c.post(
            f"/cds-services/{SERVICE}", content=b"{not json", headers={"Content-Type": "application/json"}
        )
    assert r.status_code == 401 and "missing JWT" in r.json()["message"]


def test_a_fhir_server_off_the_allowlist_is_refused_before_anything_is_read(hooks):
    svc, _, ehr, public = hooks
    body = hook_request("p-elsewhere", fhirServer="https://fhir.elsewhere.example/r4")
    del body["prefetch"]
    schema_check("CdsRequest", body)
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}", body)
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == ["fhirServer"]
    assert "fhir.elsewhere.example" in r.json()["problems"][0]["message"]
    # an unknown service and a hook this service does not offer are named too
    assert call(svc, ehr, public, "/cds-services/other", hook_request("p1")).status_code == 404
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}", {**hook_request("p1"), "hook": "order-sign"})
    assert r.status_code == 422 and "hook" in r.text


def test_cards_come_ranked_as_the_screen_ranks_without_a_model_call(hooks, screened):
    svc, srv, ehr, public = hooks
    schema_check("CdsResponse", {"cards": screened})
    assert [c["summary"].split(":")[0] for c in screened] == RANKED
    assert screened[0]["summary"] == "T-ELIGIBLE: eligible, nothing to confirm"
    assert screened[1]["summary"] == "T-CONFIRM: eligible, 1 condition to confirm"
    assert screened[2]["summary"] == "T-MISS1: near miss: eligible if 1 condition changed"
    # the order is verdict.core.ranking's over the recorded decisions, which the queued screen made
    with svc.client("audit") as a:
        records = [a.get(f"/v1/decisions/dec_{uuid.UUID(c['uuid']).hex}").json() for c in screened]
    assert {r["created_by"] for r in records} == {"cds:ehr"}
    decisions = [Decision.model_validate(r["artifacts"]["decision"]) for r in records]
    assert [row.trial_id for row in rank(decisions)] == RANKED
    page = f"/v1/decisions/{records[0]['decision_id']}/page"
    assert screened[0]["links"] == [
        {
            "label": "Open the decision on trial T-ELIGIBLE",
            "url": f"{public}/login?next={page}",
            "type": "absolute",
        }
    ]
    print("\none card as JSON:\n" + json.dumps(screened[1], indent=2))
    # known decisions: answered from the store alone, nothing asked of the formalizer
    asked = len(srv.requests)
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}", hook_request("p40"))
    assert r.status_code == 200 and r.json()["cards"] == screened
    assert len(srv.requests) == asked


def test_feedback_reaches_the_audit_chain_and_the_review_flags(hooks, screened):
    svc, _, ehr, public = hooks
    reason = {"code": "criterion-misread", "system": "urn:verdict:cds-hooks:override-reason"}
    body = {
        "feedback": [
            {"card": screened[0]["uuid"], "outcome": "accepted", "outcomeTimestamp": "2026-01-10T10:00:00Z"},
            {
                "card": screened[2]["uuid"],
                "outcome": "overridden",
                "overrideReason": {"reason": reason, "userComment": "age is recorded wrongly in the chart"},
                "outcomeTimestamp": "2026-01-10T10:01:00Z",
            },
        ]
    }
    for item in body["feedback"]:
        schema_check("Feedback", item)
    unknown = {"feedback": [{**body["feedback"][0], "card": str(uuid.uuid4())}]}
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}/feedback", unknown)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "feedback.0.card"
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}/feedback", body)
    assert r.status_code == 200, r.text
    accepted, overridden = r.json()["recorded"]
    assert (accepted["flagged"], overridden["flagged"]) == (False, True)
    with svc.client("audit") as a:
        history = a.get(f"/v1/decisions/{overridden['decision_id']}/history").json()
        flags = a.get("/v1/trials/T-MISS1/flags").json()["flags"]
        accepted_history = a.get(f"/v1/decisions/{accepted['decision_id']}/history").json()
    last = history["entries"][-1]
    assert last["parent_id"] == f"dec_{uuid.UUID(screened[2]['uuid']).hex}"
    assert [c["type"] for c in last["changes"]] == ["feedback", "flag"]
    assert (
        last["changes"][0]["details"]["outcome"] == "overridden"
        and last["changes"][0]["reviewer"] == "cds:ehr"
    )
    assert last["decision"] == history["entries"][-2]["decision"]  # a note on the decision: it stands
    assert [(f["decision_id"], f["criterion"]) for f in flags] == [(overridden["decision_id"], None)]
    assert flags[0]["note"] == "criterion-misread; age is recorded wrongly in the chart"
    assert [c["type"] for c in accepted_history["entries"][-1]["changes"]] == ["feedback"]
    # the cards now name the decisions that record the feedback
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}", hook_request("p40"))
    ids = {f"dec_{uuid.UUID(c['uuid']).hex}" for c in r.json()["cards"]}
    assert {accepted["decision_id"], overridden["decision_id"]} <= ids


@pytest.mark.browser
def test_a_browser_opens_a_card_link_and_lands_on_the_decision_after_sign_in(hooks, screened):
    need(
        CHROMIUM.exists() and CHROMEDRIVER.exists(),
        "Chromium or chromedriver missing: apt-get install -y chromium chromium-driver",
    )
    pytest.importorskip("selenium", reason="selenium missing: pip install -e '.[dev]'")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    svc, _, ehr, public = hooks
    card = call(svc, ehr, public, f"/cds-services/{SERVICE}", hook_request("p40")).json()["cards"][1]
    drv = selenium_chromium(1280, 900)
    try:
        drv.get(card["links"][0]["url"])
        assert drv.current_url.startswith(f"{public}/login")  # the sign-in first
        drv.find_element(By.NAME, "key").send_keys(svc.keys["review"])
        drv.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        decision_id = f"dec_{uuid.UUID(card['uuid']).hex}"
        # click() returns before the form's navigation ends: wait for the redirect, not a clock
        WebDriverWait(drv, 30).until(lambda d: not d.current_url.startswith(f"{public}/login"))
        assert drv.current_url == f"{public}/v1/decisions/{decision_id}/page"
        assert drv.find_element(By.CSS_SELECTOR, "#decision-id").text == decision_id
        SCREENS.mkdir(parents=True, exist_ok=True)
        shot = SCREENS / "cds-card-decision-page.png"
        drv.save_screenshot(str(shot))
        print(f"\nthe page a card opens: {shot}")
    finally:
        drv.quit()


def test_a_patient_is_read_from_the_ehrs_fhir_server_with_the_calls_token(hooks, fhir_server, fhir_topics):
    from tests.fixtures.fhir_server.data import TOKEN

    svc, _, ehr, public = hooks
    pid = fhir_topics[0]["id"]
    auth = {"access_token": TOKEN, "token_type": "Bearer", "expires_in": 300, "scope": "patient/*.read",
            "subject": "verdict"}  # fmt: skip
    body = hook_request(pid, fhirServer=fhir_server.base_url, fhirAuthorization=auth)
    del body["prefetch"]
    schema_check("CdsRequest", body)
    before = fhir_server.request_count()
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}", body)
    assert r.status_code == 200 and r.json() == {"cards": []}, r.text
    cards = cards_when_screened(svc, ehr, public, pid, body, want=1)
    assert fhir_server.request_count() > before  # read with the call's token (the server requires it)
    with svc.client("audit") as a:
        record = a.get(f"/v1/decisions/dec_{uuid.UUID(cards[0]['uuid']).hex}").json()
    assert record["artifacts"]["fhir"] is not None and record["created_by"] == "cds:ehr"


def test_a_jwks_url_is_read_over_http_and_must_pass_the_egress_allowlist(tmp_path):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from pydantic import ValidationError
    from verdict.data_gen.formalizer.egress import EgressPolicy
    from verdict.serve.api_config import ApiConfig, CdsHooksConfig
    from verdict.serve.cds_hooks.client_jwt import ClientJwt
    from verdict.serve.errors import ServeConfigError

    ehr, aud = Ehr(tmp_path), "https://verdict.site.example"
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{ehr.jwks.name}"
        cfg = CdsHooksConfig(clients=[{"name": "ehr", "issuer": ISSUER, "jwks_url": url}])
        verifier = ClientJwt(cfg, aud, EgressPolicy.from_config(env=False))
        assert verifier.verify(f"Bearer {ehr.token(aud)}", f"{aud}/cds-services").name == "ehr"
    finally:
        server.shutdown()
        server.server_close()
    elsewhere = CdsHooksConfig(
        clients=[{"name": "ehr", "issuer": ISSUER, "jwks_url": "https://keys.elsewhere.example/jwks.json"}]
    )
    with pytest.raises(ServeConfigError, match="keys.elsewhere.example.*egress allowlist"):
        ClientJwt(elsewhere, aud, EgressPolicy.from_config(env=False))
    with pytest.raises(ValidationError, match="cds_hooks.clients needs public_url"):
        ApiConfig(cds_hooks={"clients": [{"name": "ehr", "issuer": ISSUER, "jwks_file": str(ehr.jwks)}]})


def test_a_trial_registered_later_is_screened_for_a_known_patient_alone(hooks, screened):
    from tests.serve.test_screen import _program

    svc, _, ehr, public = hooks
    svc.upload(_program("T-NEW", 30, "has_chest_pain"))
    r = call(svc, ehr, public, f"/cds-services/{SERVICE}", hook_request("p40"))
    assert r.status_code == 200 and len(r.json()["cards"]) == len(RANKED)  # what is known, at once
    cards = cards_when_screened(svc, ehr, public, "p40", want=len(RANKED) + 1)
    assert [c["summary"].split(":")[0] for c in cards][:2] == ["T-ELIGIBLE", "T-NEW"]
    # only the new trial was screened: the other trials' decisions (the cards' ids) are the same
    assert {c["uuid"] for c in r.json()["cards"]} < {c["uuid"] for c in cards}


def queue_calls(tmp_path, calls: list[tuple[str, dict[str, str]]]) -> tuple[list[bool], list[list[str]]]:
    """Each (patient, missing trials -> active program hash) queued as a hook call queues it, in one
    go (no await in between: the worker takes nothing off the queue meanwhile); whether each was
    queued, and the trials of each queued screening. The queue holds 3."""
    import asyncio

    from verdict.serve.api_config import ApiConfig
    from verdict.serve.cds_hooks.protocol import HookRequest
    from verdict.serve.cds_hooks.serving import CdsHooksService
    from verdict.serve.reviews.serving import ReviewService
    from verdict.serve.services import Services

    ehr = Ehr(tmp_path)
    cfg = ApiConfig(
        audit_db=str(tmp_path / "audit.sqlite"),
        api_keys=str(tmp_path / "keys.json"),
        public_url="https://verdict.site.example",
        cds_hooks={
            "clients": [{"name": "ehr", "issuer": ISSUER, "jwks_file": str(ehr.jwks)}],
            "queue_size": 3,
        },
    )
    services = Services(cfg, "http://127.0.0.1:9/v1")
    hooks = CdsHooksService(services, ReviewService(services))
    client = cfg.cds_hooks.clients[0]

    async def queue_in_order() -> tuple[list[bool], list[list[str]]]:
        try:
            queued = [
                hooks.queue_screening(HookRequest.model_validate(hook_request(pid)), client, missing)
                for pid, missing in calls
            ]
            jobs = [hooks.queue.get_nowait().trial_ids for _ in range(hooks.queue.qsize())]
            return queued, jobs
        finally:
            await hooks.aclose()

    try:
        return asyncio.run(queue_in_order())
    finally:
        services.audit.close()


def test_the_screening_queue_is_bounded_and_a_patient_is_queued_once_for_the_same_trials(tmp_path):
    queued, jobs = queue_calls(
        tmp_path,
        [
            ("a", {"T1": "v1"}),
            ("b", {"T1": "v1"}),
            ("a", {"T1": "v1"}),  # the same trials again: already queued
            ("a", {"T1": "v1", "T2": "v1"}),  # a trial registered since: queued for it alone
            ("c", {"T1": "v1"}),  # the queue holds 3: refused, answered as before
        ],
    )
    assert queued == [True, True, False, True, False]
    assert jobs == [["T1"], ["T1"], ["T2"]]


def test_a_call_during_a_screening_does_not_screen_its_trials_again(tmp_path):
    """A hook call while the patient's screening runs finds some of its trials decided and the rest
    missing: those are queued already (it re-screened them, recording second decisions, before);
    a revised program is a new trial version, queued at once."""
    queued, jobs = queue_calls(
        tmp_path,
        [
            ("a", {"T1": "v1", "T2": "v1", "T3": "v1"}),
            ("a", {"T2": "v1", "T3": "v1"}),  # T1 decided, the screening still runs
            ("a", {"T3": "v1"}),
            ("a", {"T1": "v2", "T3": "v1"}),  # T1's program revised since
        ],
    )
    assert queued == [True, False, False, True]
    assert jobs == [["T1", "T2", "T3"], ["T1"]]
