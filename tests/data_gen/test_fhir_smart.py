"""SMART Backend Services against a real token endpoint (authlib, tests/fixtures/oauth_server) in front
of the real FHIR test server, which behind it requires the token: the signed assertion, discovery,
the token kept and renewed once on a 401, and every refusal a clear error without key or token."""

import json
import logging
import time

import pytest
from verdict.data_gen.fhir.errors import FhirServerError
from verdict.data_gen.fhir.rest import FhirRestClient, FhirRestConfig
from verdict.data_gen.fhir.smart import SmartAuthError, SmartBackendConfig
from verdict.data_gen.fhir.sources import load_source
from verdict.data_gen.formalizer.egress import EgressPolicy
from verdict.data_gen.formalizer.errors import EgressRefused

from tests.fixtures.fhir_server.data import AT, TOKEN
from tests.support import run_verdict

PATIENT = "trec-202129"  # a topic with a coded lab in umol/L (a conversion)


def rest(smart_fhir, smart: SmartBackendConfig, **kw) -> FhirRestConfig:
    return FhirRestConfig(base_url=kw.pop("base_url", smart_fhir.url), smart=smart, **kw)


def secrets_of(smart_fhir, keys: dict[str, bytes]) -> list[str]:
    """What must never be shown: each key's PEM body lines and every token the server issued."""
    lines = [ln for pem in keys.values() for ln in pem.decode().splitlines() if not ln.startswith("-----")]
    return lines + list(smart_fhir.tokens)


@pytest.mark.parametrize("alg,discover", [("RS384", True), ("ES384", False)])
def test_an_authorized_read_gives_the_records_of_the_plain_token_read(
    smart_fhir, fhir_server, smart_client, smart_keys, alg, discover, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG)
    smart = smart_client(f"site-{alg}", alg, token_url=None if discover else smart_fhir.token_url)
    asked = len(smart_fhir.token_answers)
    got = load_source(smart_fhir.url, AT, patient=PATIENT, rest=rest(smart_fhir, smart)).records
    assert smart_fhir.token_answers[asked:] == [(smart.client_id, 200)]  # one token, kept for every request
    assert smart_fhir.fhir_answers[-1][1] == 200
    monkeypatch.setenv("VERDICT_FHIR_TOKEN", TOKEN)
    (plain,) = load_source(fhir_server.base_url, AT, patient=PATIENT).records
    assert [r.model_dump() for r in got] == [plain.model_dump()] and got[0].conversions()
    with FhirRestClient(rest(smart_fhir, smart)) as client:
        client.get_json(f"Patient/{PATIENT}")
        shown = caplog.text + repr(client.smart) + repr(client.cfg)
    assert not any(s in shown for s in secrets_of(smart_fhir, smart_keys))


def test_an_expired_assertion_is_refused(smart_fhir, smart_client):
    smart = smart_client("skewed", token_url=smart_fhir.token_url)
    before = len(smart_fhir.fhir_answers)
    late = FhirRestClient(rest(smart_fhir, smart), clock=lambda: time.time() - 600)  # exp 5 min ago
    with pytest.raises(
        SmartAuthError, match=r"refused client 'skewed' with HTTP 400: invalid_client \(.*expired"
    ):
        late.patient_ids([])
    late.close()
    assert smart_fhir.token_answers[-1] == ("skewed", 400) and len(smart_fhir.fhir_answers) == before


def test_the_wrong_audience_is_refused(smart_fhir, smart_client, smart_keys, caplog):
    caplog.set_level(logging.DEBUG)
    alias = smart_fhir.token_url.replace("127.0.0.1", "localhost")  # the same endpoint, another name
    smart = smart_client("aliased", token_url=alias)
    with pytest.raises(SmartAuthError, match=r"HTTP 400: invalid_client \(.*aud") as e:
        load_source(smart_fhir.url, AT, patient=PATIENT, rest=rest(smart_fhir, smart))
    assert not any(s in str(e.value) or s in caplog.text for s in secrets_of(smart_fhir, smart_keys))


def test_a_revoked_client_gets_no_new_token(smart_fhir, smart_client):
    smart = smart_client("revoked")
    with FhirRestClient(rest(smart_fhir, smart)) as client:
        assert client.get_json(f"Patient/{PATIENT}")["id"] == PATIENT
        smart_fhir.revoke(
            "revoked"
        )  # its token dies with it: the next request is a 401, then a new token is asked
        with pytest.raises(SmartAuthError, match=r"refused client 'revoked' with HTTP 400: invalid_client"):
            client.get_json(f"Patient/{PATIENT}")
    assert [s for c, s in smart_fhir.token_answers if c == "revoked"] == [200, 400]


def test_a_401_between_pages_renews_the_token_once_and_the_read_goes_on(
    smart_fhir, fhir_server, smart_client, monkeypatch
):
    smart = smart_client("pager")
    asked, seen = len(smart_fhir.token_answers), len(smart_fhir.fhir_answers)
    problems: list[str] = []
    with FhirRestClient(rest(smart_fhir, smart, page_size=7)) as client:
        smart_fhir.expire_tokens_at(3)  # the third page finds its token expired
        found = client.search("Patient", {}, problems)
    answers = smart_fhir.fhir_answers[seen:]
    assert [s for _, s, _ in answers].count(401) == 1 and answers[2][1] == 401 and answers[3][1] == 200
    assert smart_fhir.token_answers[asked:] == [("pager", 200), ("pager", 200)]
    monkeypatch.setenv("VERDICT_FHIR_TOKEN", TOKEN)
    with FhirRestClient(FhirRestConfig(base_url=fhir_server.base_url, page_size=1000)) as plain:
        everyone = [r["id"] for r in plain.search("Patient", {}, [])]  # one page, no token change
    ids = [r["id"] for r in found]
    assert len(ids) > 7 * 3 and not problems
    assert sorted(ids) == sorted(everyone) and len(ids) == len(set(ids))  # nothing lost or read twice


def test_a_second_401_after_a_new_token_is_a_clear_error(smart_fhir, fhir_server, smart_client):
    # the FHIR server itself, which knows only its own token: every SMART token gets a 401
    smart = smart_client("unknown-there", token_url=smart_fhir.token_url)
    before = fhir_server.request_count()
    with FhirRestClient(rest(smart_fhir, smart, base_url=fhir_server.base_url)) as client:
        with pytest.raises(
            FhirServerError, match=r"HTTP 401 again with a new SMART access token: check that "
        ):
            client.get_json(f"Patient/{PATIENT}")
    assert fhir_server.request_count() - before == 2  # sent once more, not again and again
    assert [s for c, s in smart_fhir.token_answers if c == "unknown-there"] == [200, 200]


def test_a_key_file_others_may_read_is_refused_naming_it(smart_fhir, smart_client, smart_keys):
    smart = smart_client("loose")
    smart.private_key_file.chmod(0o644)
    asked, seen = len(smart_fhir.token_answers), len(smart_fhir.fhir_answers)
    with pytest.raises(
        SmartAuthError, match=r"loose\.pem has mode 0644: .* refused \(only its owner may"
    ) as e:
        FhirRestClient(rest(smart_fhir, smart))
    assert str(smart.private_key_file) in str(e.value)
    assert not any(s in str(e.value) for s in secrets_of(smart_fhir, smart_keys))
    assert (len(smart_fhir.token_answers), len(smart_fhir.fhir_answers)) == (asked, seen)  # nothing sent


def test_a_token_endpoint_off_the_allowlist_is_refused_before_any_request(
    smart_fhir, smart_client, monkeypatch
):
    monkeypatch.delenv("VERDICT_EGRESS_ALLOW", raising=False)
    configured = smart_client("configured", token_url="https://auth.elsewhere.example/token")
    with pytest.raises(EgressRefused, match="a SMART token request .* 'auth.elsewhere.example'"):
        FhirRestClient(rest(smart_fhir, configured))
    discovered = smart_client("discovered")
    asked = len(smart_fhir.token_answers)
    smart_fhir.announce_token_url = "https://auth.elsewhere.example/token"
    try:
        with FhirRestClient(rest(smart_fhir, discovered)) as client:
            with pytest.raises(EgressRefused, match="'auth.elsewhere.example'"):
                client.patient_ids([])
    finally:
        smart_fhir.announce_token_url = None
    assert len(smart_fhir.token_answers) == asked
    with pytest.raises(ValueError, match="must be https"):
        SmartBackendConfig(
            client_id="c", private_key_file="k.pem", key_id="k", token_url="http://auth.example/token"
        )
    assert EgressPolicy.from_config().host_allowed("127.0.0.1")


def test_the_token_goes_to_the_fhir_server_only(smart_fhir, fhir_server, monkeypatch):
    # an attachment URL on another allowlisted origin (here the proxy's port) gets no Authorization header
    monkeypatch.setenv("VERDICT_FHIR_TOKEN", TOKEN)
    with FhirRestClient(FhirRestConfig(base_url=fhir_server.base_url)) as client:
        status, _, _ = client.get(f"{smart_fhir.url}/Binary/elsewhere")
    assert status == 401 and smart_fhir.fhir_answers[-1] == ("/Binary/elsewhere", 401, False)


def test_the_cli_reads_with_a_smart_config_and_prints_the_public_jwks(smart_fhir, smart_client, tmp_path):
    smart = smart_client("cli")
    config = tmp_path / "fhir.yaml"
    config.write_text(json.dumps({"page_size": 50, "smart": smart.model_dump(mode="json")}))
    r = run_verdict(
        "fhir", "load", smart_fhir.url, "--at", AT.isoformat(), "--patient", PATIENT, "--config", str(config)
    )
    assert r.returncode == 0, r.stderr
    assert f"Patient/{PATIENT}: age" in r.stdout and "1 patients from rest source" in r.stdout
    r = run_verdict("fhir", "smart-jwks", "--key", str(smart.private_key_file), "--kid", "k1")
    (key,) = json.loads(r.stdout)["keys"]
    assert key["kid"] == "k1" and key["alg"] == "RS384" and key["kty"] == "RSA" and "d" not in key
