"""Resource validation: a bad resource is reported by Type/id and field path, never by content,
and extreme or hostile input is a clear problem, not a crash."""

import base64

import pytest
from verdict.data_gen.fhir.errors import FhirSourceError
from verdict.data_gen.fhir.validate import Validated, parse_json, validate_all, validate_resource

SECRET = "Zanzibar-Quixote"  # stands for patient text: must never appear in a problem


def obs(value, oid="o1"):
    return {
        "resourceType": "Observation",
        "id": oid,
        "status": "final",
        "code": {"text": SECRET},
        "subject": {"reference": "Patient/p1"},
        "valueQuantity": {"value": value, "unit": "mg/dL"},
    }


def test_invalid_resource_is_named_by_id_and_path_and_the_rest_loads():
    bad = {
        "resourceType": "Patient",
        "id": "p9",
        "gender": 3,
        "birthDate": "1970-02-30",
        "name": [{"family": SECRET, "given": SECRET}],
    }
    out = validate_all([(bad, "entry[0]"), (obs(1.2), "entry[1]")])
    assert [r.id for r in out.resources] == ["o1"]
    text = "\n".join(p for _, p in out.problems)
    assert (
        "Patient/p9: gender:" in text
        and "Patient/p9: birthDate:" in text
        and "Patient/p9: name.0.given:" in text
    )
    assert SECRET not in text and "1970-02-30" not in text
    assert out.problems[0][0] == "p9"  # the problem reaches that patient


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400x", [1, 2]])
def test_malformed_numbers_are_problems(value):
    out = Validated()
    assert validate_resource(obs(value), "line 1", out) is None
    assert out.problems and out.problems[0][1].startswith("Observation/o1: valueQuantity.value:")


def test_nan_and_infinity_literals_are_not_json():
    with pytest.raises(FhirSourceError, match="NaN is not valid JSON"):
        parse_json('{"value": NaN}', "x.ndjson line 3")
    with pytest.raises(FhirSourceError, match="x.ndjson line 3: not valid JSON"):
        parse_json('{"value": ' + SECRET, "x.ndjson line 3")


def test_deep_nesting_is_refused_without_recursion():
    ext: dict = {"url": "http://x"}
    for _ in range(5000):
        ext = {"url": "http://x", "extension": [ext]}
    raw = {"resourceType": "Patient", "id": "deep", "extension": [ext]}
    out = validate_all([(raw, "entry[0]")])
    assert out.problems == [("deep", "Patient/deep: nested deeper than 64 levels; not read")]
    with pytest.raises(FhirSourceError, match="nested too deeply"):
        parse_json("[" * 100000 + "]" * 100000, "bundle b.json")


def test_oversized_attachment_is_left_out_with_a_problem():
    data = base64.b64encode(b"x" * (2 * 2**20)).decode()
    raw = {
        "resourceType": "DocumentReference",
        "id": "big",
        "status": "current",
        "subject": {"reference": "Patient/p1"},
        "content": [{"attachment": {"contentType": "text/plain", "data": data}}],
    }
    out = validate_all([(raw, "entry[0]")], max_attachment_bytes=2**20)
    assert out.resources and out.resources[0].content[0].attachment.data is None
    assert (
        "DocumentReference/big: content[0].attachment.data: attachment is 2.0 MiB, over the limit"
        in out.problems[0][1]
    )


def test_unread_types_are_counted_not_reported_and_ids_are_sanitized():
    out = validate_all(
        [
            ({"resourceType": "Encounter", "id": "e1"}, "entry[0]"),
            ({"resourceType": "Patient", "id": SECRET + " !", "gender": 3}, "entry[1]"),
            ("not an object", "entry[2]"),
        ]
    )
    assert out.skipped_types == {"Encounter": 1}
    texts = [p for _, p in out.problems]
    assert texts[0].startswith("Patient at entry[1]: ") and SECRET not in texts[0]
    assert texts[-1] == "entry[2]: not a JSON object"
