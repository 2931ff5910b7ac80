"""The REST source against a real FHIR server (@medplum/fhir-router, tests/fixtures/fhir_server):
the same records as the bundle, paging, the bearer token, and the egress allowlist before any request."""

import logging

import pytest
from verdict.data_gen.fhir.errors import FhirServerError
from verdict.data_gen.fhir.rest import FhirRestClient, FhirRestConfig
from verdict.data_gen.fhir.sources import load_source
from verdict.data_gen.formalizer.egress import EgressPolicy
from verdict.data_gen.formalizer.errors import EgressRefused

from tests.fixtures.fhir_server.data import AT, TOKEN, write_bundle

CODED = ["trec-202124", "trec-202129", "trec-202132"]


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("VERDICT_FHIR_TOKEN", TOKEN)


@pytest.mark.slow  # ~30 s: 600 requests, the in-memory server's patient searches take ~50 ms each
def test_rest_gives_the_same_records_as_the_bundle(fhir_server, fhir_topics, token, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    bundle = load_source(str(write_bundle(tmp_path / "b.json", fhir_topics)), AT)
    cfg = FhirRestConfig(base_url=fhir_server.base_url, page_size=7)  # several pages per search
    before = len(fhir_server.request_paths())
    rest = load_source(fhir_server.base_url, AT, rest=cfg)
    paths = fhir_server.request_paths()[before:]
    assert sum(p.endswith("$everything") for p in paths) == 1  # the fallback is learnt once, not per patient
    ids = {r.patient_id for r in bundle.records}
    assert rest.kind == "rest" and ids <= {r.patient_id for r in rest.records} and len(ids) == 75
    same = [r.model_dump() for r in rest.records if r.patient_id in ids]
    assert same == [r.model_dump() for r in bundle.records]
    assert not rest.problems
    texts = [d.text for r in rest.records for d in r.documents]
    assert not any(t[:40] in caplog.text for t in texts)


def test_one_patient_with_a_conversion(fhir_server, token):
    (rec,) = load_source(fhir_server.base_url, AT, patient="trec-202129").records
    (conv,) = rec.conversions()
    assert conv.resource == "Observation/obs-202129-creatinine" and conv.converted.value == 0.9004


def test_missing_token_is_a_clear_error(fhir_server, monkeypatch):
    monkeypatch.delenv("VERDICT_FHIR_TOKEN", raising=False)
    with pytest.raises(FhirServerError, match=r"HTTP 401: check the bearer token in \$VERDICT_FHIR_TOKEN"):
        load_source(fhir_server.base_url, AT, patient="trec-202124")


def test_non_allowlisted_host_is_refused_before_any_request(fhir_server, token, monkeypatch):
    monkeypatch.delenv("VERDICT_EGRESS_ALLOW", raising=False)
    before = fhir_server.request_count()
    strict = EgressPolicy(allow_loopback=False)  # the real server, but not allowed: nothing may reach it
    with pytest.raises(EgressRefused, match="refused: a FHIR request would send patient text"):
        FhirRestClient(FhirRestConfig(base_url=fhir_server.base_url), policy=strict)
    with pytest.raises(EgressRefused, match="'fhir.elsewhere.example'"):
        load_source("https://fhir.elsewhere.example/r4", AT, patient="trec-202124")
    assert fhir_server.request_count() == before


def test_a_next_link_off_the_allowlist_is_refused(fhir_server, token):
    client = FhirRestClient(FhirRestConfig(base_url=fhir_server.base_url))
    page = {
        "resourceType": "Bundle",
        "entry": [],
        "link": [{"relation": "next", "url": "https://evil.example/p2"}],
    }
    with pytest.raises(EgressRefused):
        client._pages(page, "Observation", [])
    client.close()


def test_unknown_patient_is_a_clear_error(fhir_server, token):
    with pytest.raises(Exception, match="Patient/nobody is not on the FHIR server"):
        load_source(fhir_server.base_url, AT, patient="nobody")


def test_attachment_by_url_is_read_through_the_client(fhir_server, token):
    import base64

    html = b"<p>Creatinine: 0.9 mg/dL</p><p>A1c: 11.3%</p>"
    fhir_server.put({"resourceType": "Patient", "id": "url-doc-1", "birthDate": "1980-01-01"}, TOKEN)
    fhir_server.put(
        {
            "resourceType": "Binary",
            "id": "bin-1",
            "contentType": "text/html",
            "data": base64.b64encode(html).decode(),
        },
        TOKEN,
    )
    fhir_server.put(
        {
            "resourceType": "DocumentReference",
            "id": "doc-url-1",
            "status": "current",
            "subject": {"reference": "Patient/url-doc-1"},
            "date": "2024-04-01T00:00:00Z",
            "content": [
                {"attachment": {"contentType": "text/html", "url": "Binary/bin-1"}},
                {"attachment": {"contentType": "text/plain", "url": "https://evil.example/x"}},
            ],
        },
        TOKEN,
    )
    (rec,) = load_source(fhir_server.base_url, AT, patient="url-doc-1").records
    assert [(d.id, d.text) for d in rec.documents] == [
        ("DocumentReference/doc-url-1", "Creatinine: 0.9 mg/dL\n\nA1c: 11.3%")
    ]
    assert any("content[1].attachment.url: refused" in p for p in rec.problems)  # tried first (text/plain)
