"""Bundle and Bulk Data NDJSON give the same records; bad input is reported by id and the rest loads;
no patient text reaches the log."""

import base64
import datetime as dt
import json
import logging

import pytest
from verdict.data_gen.fhir.errors import FhirSourceError
from verdict.data_gen.fhir.sources import load_source

from tests.fixtures.fhir_server.data import AT, topic_resources, write_bundle, write_ndjson

CODED = ["trec-202124", "trec-202129", "trec-202132"]


@pytest.fixture(scope="module")
def resources(fhir_topics):
    return topic_resources()


def dump(result):
    return [r.model_dump() for r in result.records]


def test_bundle_and_ndjson_give_the_same_records(resources, tmp_path):
    bundle = load_source(str(write_bundle(tmp_path / "b.json", resources)), AT)
    ndjson = load_source(str(write_ndjson(tmp_path / "export", resources)), AT)
    assert bundle.kind == "bundle" and ndjson.kind == "ndjson"
    assert len(bundle.records) == 75
    assert dump(bundle) == dump(ndjson)
    rec = next(r for r in bundle.records if r.patient_id == "trec-202129")
    assert rec.age_years == 24 and rec.gender == "male"
    assert [d.id for d in rec.documents] == ["DocumentReference/doc-trec-202129"]
    assert rec.documents[0].date == "2024-04-30" and "A1c: 11.3%" in rec.documents[0].text
    (creat,) = rec.conversions()
    assert creat.resource == "Observation/obs-202129-creatinine"
    assert (creat.converted.value, creat.converted.unit) == (0.9004, "mg/dL")
    assert rec.patient_doc().note_documents()[0].id == "DocumentReference/doc-trec-202129"


def test_age_needs_a_stated_date_and_follows_it(resources, tmp_path):
    path = str(write_bundle(tmp_path / "b.json", resources))
    with pytest.raises(FhirSourceError, match="reference date is required"):
        load_source(path, None)  # type: ignore[arg-type]
    earlier = load_source(path, dt.date(2019, 5, 1), patient="trec-202129")
    assert earlier.records[0].age_years == 19


def test_invalid_resources_are_reported_by_id_and_the_rest_loads(resources, tmp_path, caplog):
    secret = "Quixote-Zanzibar"
    bad_obs = {
        "resourceType": "Observation",
        "id": "bad-1",
        "status": "final",
        "code": {"text": secret},
        "subject": {"reference": "Patient/trec-202124"},
        "valueQuantity": {"value": "NaN", "unit": "mg/dL"},
    }
    huge = {**bad_obs, "id": "huge-1", "valueQuantity": {"value": 1e300, "unit": "mg/dL"}}
    html = {
        "resourceType": "DiagnosticReport",
        "id": "rep-1",
        "status": "final",
        "code": {"text": "x"},
        "subject": {"reference": "Patient/trec-202124"},
        "effectiveDateTime": "2024-04-29",
        "presentedForm": [
            {
                "contentType": "text/html",
                "data": base64.b64encode(f"<p>{secret}</p><p>two</p>".encode()).decode(),
            }
        ],
    }
    by_url = {
        **html,
        "id": "rep-2",
        "presentedForm": [{"contentType": "text/plain", "url": "https://elsewhere/x"}],
    }
    orphan = {
        "resourceType": "Condition",
        "id": "c-orphan",
        "code": {"text": secret},
        "subject": {"reference": "urn:uuid:unknown"},
    }
    path = tmp_path / "export"
    write_ndjson(path, resources + [bad_obs, huge, html, by_url, orphan])
    with (path / "Observation.ndjson").open("a") as f:
        f.write('{"resourceType": "Observation", "id": ' + json.dumps(secret) + "\n")  # truncated line
    caplog.set_level(logging.DEBUG)
    result = load_source(str(path), AT)
    assert len(result.records) == 75
    rec = next(r for r in result.records if r.patient_id == "trec-202124")
    problems = "\n".join(rec.problems)
    assert "Observation/bad-1: valueQuantity.value:" in problems
    assert "Observation/huge-1: valueQuantity.value: too large" in problems
    assert (
        "DiagnosticReport/rep-2: presentedForm[0].url: attachment by URL needs a FHIR server source"
        in problems
    )
    assert [d.id for d in rec.documents] == ["DiagnosticReport/rep-1", "DocumentReference/doc-trec-202124"]
    assert rec.documents[0].text == f"{secret}\n\ntwo"  # HTML as text
    assert "Observation.ndjson line 8: not valid JSON" in "\n".join(result.problems)
    assert "Condition/c-orphan: subject is not a Patient of this source; not read" in result.problems
    everything = problems + "\n".join(result.problems) + caplog.text
    assert secret not in everything


def test_bundle_resolves_urn_uuid_subjects(tmp_path):
    resources = topic_resources(["trec-202124"])
    for r in resources:
        if r["resourceType"] != "Patient":
            r["subject"] = {
                "reference": "urn:uuid:Patient-trec-202124"
            }  # the bundle's fullUrl of the Patient
    (rec,) = load_source(str(write_bundle(tmp_path / "b.json", resources)), AT).records
    assert rec.patient_id == "trec-202124" and len(rec.documents) == 1 and len(rec.facts) == 1


def test_unreadable_sources_are_clear_errors(tmp_path):
    (tmp_path / "x.json").write_text('{"resourceType": "Patient"}')
    with pytest.raises(FhirSourceError, match="not a FHIR Bundle"):
        load_source(str(tmp_path / "x.json"), AT)
    with pytest.raises(FhirSourceError, match="does not exist"):
        load_source(str(tmp_path / "nope.json"), AT)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FhirSourceError, match="no \\*.ndjson files"):
        load_source(str(tmp_path / "empty"), AT)


def test_a_50_mib_attachment_is_a_problem_not_a_crash(tmp_path):
    resources = topic_resources(["trec-202124"])
    big = {
        "resourceType": "DocumentReference",
        "id": "doc-huge",
        "status": "current",
        "subject": {"reference": "Patient/trec-202124"},
        "content": [
            {
                "attachment": {
                    "contentType": "text/plain",
                    "data": base64.b64encode(b"a" * 50 * 2**20).decode(),
                }
            }
        ],
    }
    (rec,) = load_source(str(write_ndjson(tmp_path / "export", resources + [big])), AT).records
    assert [d.id for d in rec.documents] == ["DocumentReference/doc-trec-202124"]
    assert any(
        p.startswith(
            "DocumentReference/doc-huge: content[0].attachment.data: attachment is 50.0 MiB, over "
            "the limit of 10 MiB; left out"
        )
        for p in rec.problems
    )


def test_binary_non_utf8_empty_and_duplicate_documents_are_reported_by_id_and_the_rest_loads(tmp_path):
    """A chart's bad documents (a PDF, bytes that are not the stated charset, an empty text, the
    same resource twice): each is skipped and named by id; every good document still loads."""

    def doc(rid: str, content_type: str, data: bytes) -> dict:
        return {
            "resourceType": "DocumentReference",
            "id": rid,
            "status": "current",
            "subject": {"reference": "Patient/trec-202124"},
            "content": [
                {"attachment": {"contentType": content_type, "data": base64.b64encode(data).decode()}}
            ],
        }

    resources = topic_resources(["trec-202124"])
    extra = [
        doc("doc-pdf", "application/pdf", b"%PDF-1.7\n\x00\x01binary"),
        doc("doc-latin", "text/plain; charset=utf-8", "caf\u00e9 au lait".encode("latin-1")),
        doc("doc-blank", "text/plain", b"   \n"),
        doc("doc-good", "text/plain", b"Follow-up: no new complaints."),
    ]
    (rec,) = load_source(str(write_ndjson(tmp_path / "export", resources + extra + extra[-1:])), AT).records
    ids = [d.id for d in rec.documents]
    assert "DocumentReference/doc-trec-202124" in ids and ids.count("DocumentReference/doc-good") == 1
    problems = "\n".join(rec.problems)
    assert (
        "DocumentReference/doc-pdf: content[0].attachment.contentType: 'application/pdf' is not read"
        in problems
    )
    assert "DocumentReference/doc-latin: content[0].attachment: text is not valid utf-8" in problems
    assert "DocumentReference/doc-blank: the attachment holds no text (blank); no document" in problems
    assert not any(d.id.endswith(("doc-pdf", "doc-latin", "doc-blank")) for d in rec.documents)
