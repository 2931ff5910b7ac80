"""Implausible coded facts are refused by resource id, never observed; the rest of the record loads.

Ranges and date bounds come from the site code map (configs/fhir/codes.yaml)."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError
from verdict.data_gen.fhir.code_map import load_code_map
from verdict.data_gen.fhir.errors import FhirSourceError
from verdict.data_gen.fhir.resolve import resolve_coded
from verdict.data_gen.fhir.sources import load_source

from tests.data_gen.test_fhir_resolve import PROGRAM
from tests.fixtures.fhir_server.data import AT, document, observation, write_bundle

CREATININE = "2160-0"


def note(pid: str) -> dict:
    return document({"_id": pid, "text": "note"})


def resources() -> list[dict]:
    return [
        {"resourceType": "Patient", "id": "p1", "birthDate": "1980-03-01"},
        note("p1"),
        observation("obs-negative", "p1", CREATININE, -5, "mg/dL", "2024-04-30"),
        observation("obs-huge", "p1", "14682-9", 1e15, "umol/L", "2024-04-29"),
        observation("obs-usable", "p1", CREATININE, 1.1, "mg/dL", "2024-04-20"),
        {"resourceType": "Patient", "id": "p2", "birthDate": "0800-01-01"},
        note("p2"),
    ]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = write_bundle(tmp_path_factory.mktemp("b") / "b.json", resources())
    return {r.patient_id: r for r in load_source(str(path), AT).records}


def test_implausible_lab_values_are_refused_by_resource_id_and_the_rest_loads(records):
    rec = records["p1"]
    problems = "\n".join(rec.problems)
    assert (
        "Observation/obs-negative: value of creatinine is below the plausible minimum 0.05 mg/dL" in problems
    )
    assert "Observation/obs-huge: value of creatinine is above the plausible maximum 40 mg/dL" in problems
    by_id = {f.resource: f for f in rec.facts}
    assert set(by_id) == {"Observation/obs-negative", "Observation/obs-huge", "Observation/obs-usable"}
    assert by_id["Observation/obs-negative"].value is None and by_id["Observation/obs-negative"].refused
    assert by_id["Observation/obs-huge"].value is None and "-5" not in problems and "1e+15" not in problems
    assert by_id["Observation/obs-usable"].value == 1.1 and by_id["Observation/obs-usable"].refused is None
    assert rec.age_years == 44 and len(rec.documents) == 1
    # the most recent plausible value decides the atom
    out = resolve_coded(_program(), rec, load_code_map())
    creat = next(r for r in out.resolutions if r.atom == "serum_creatinine")
    assert creat.value == 1.1 and creat.evidence_source == "Observation/obs-usable"


def test_a_birth_date_in_the_year_800_gives_no_age(records):
    rec = records["p2"]
    assert rec.birth_date is None and rec.age_years is None and rec.age_range is None
    assert any(p.startswith("Patient/p2: birthDate: gives an age over 125 years") for p in rec.problems)
    assert len(rec.documents) == 1  # the rest of the record loads


def test_a_record_given_as_is_cannot_slip_implausible_values_past_the_resolver(records):
    """A record posted to the API did not pass the loader: the resolver refuses the values itself."""
    rec = records["p1"]
    facts = [
        f.model_copy(update={"value": -5.0, "refused": None})
        if f.resource == "Observation/obs-negative"
        else f
        for f in rec.facts
        if f.resource != "Observation/obs-usable"
    ]
    old = records["p2"].model_copy(update={"birth_date": "0800-01-01", "age_years": 1224})
    out = resolve_coded(_program(), rec.model_copy(update={"facts": facts}), load_code_map())
    assert "serum_creatinine" in out.left_for_miner
    assert out.notes["serum_creatinine"].startswith("Observation/obs-negative: value of creatinine is below")
    assert out.refused == [out.notes["serum_creatinine"].removesuffix("; left for the miner")]
    aged = resolve_coded(_program(), old, load_code_map())
    assert "age_years" in aged.left_for_miner and "over 125 years" in aged.notes["age_years"]
    assert aged.refused == [
        "Patient/p2: birthDate gives an age over 125 years at the reference date "
        "(configs/fhir/codes.yaml); not used"
    ]


def test_an_implausible_reference_date_is_a_clear_error(tmp_path):
    path = write_bundle(tmp_path / "b.json", resources())
    with pytest.raises(FhirSourceError, match="reference date 9999-12-31 is more than 366 days after today"):
        load_source(str(path), dt.date(9999, 12, 31))
    with pytest.raises(FhirSourceError, match="reference date 1800-01-01 is before 1900-01-01"):
        load_source(str(path), dt.date(1800, 1, 1))


def test_the_api_refuses_an_implausible_reference_date(records):
    from verdict.serve.protocol import PatientInput

    rec = records["p1"].model_copy(update={"reference_date": "9999-12-31", "age_years": 8019})
    with pytest.raises(ValidationError, match="`fhir.reference_date` is more than 366 days after today"):
        PatientInput.model_validate({"patient_id": "p1", "fhir": rec.model_dump(mode="json")})
    PatientInput.model_validate({"patient_id": "p1", "fhir": records["p1"].model_dump(mode="json")})


def _program():
    from verdict.core.program import load_program

    return load_program(PROGRAM)
