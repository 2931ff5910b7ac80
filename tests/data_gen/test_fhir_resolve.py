"""Coded facts decide atoms without the miner: a coded lab value (converted where needed, with the
conversion in the evidence) resolves its atom, which is then not left for the miner."""

import pytest
from verdict.core.engine import decide
from verdict.core.patient import ResolvedPatient
from verdict.core.program import load_program
from verdict.data_gen.fhir.code_map import load_code_map
from verdict.data_gen.fhir.resolve import resolve_coded
from verdict.data_gen.fhir.sources import load_source

from tests.fixtures.fhir_server.data import AT, topic_resources, write_bundle

PROGRAM = {
    "trial_id": "FHIR-TEST-1",
    "atoms": [
        {
            "name": "age_years",
            "domain": "int",
            "kind": "demographic",
            "unit": "years",
            "definition": "Age in years.",
        },
        {
            "name": "serum_creatinine",
            "domain": "real",
            "kind": "lab_value",
            "unit": "mg/dL",
            "definition": "Most recent serum creatinine.",
            "time_scope": {"kind": "within", "amount": 30, "unit": "days"},
        },
        {
            "name": "hba1c_mmol_mol",
            "domain": "real",
            "kind": "lab_value",
            "unit": "mmol/mol",
            "definition": "Most recent HbA1c (IFCC).",
        },
        {
            "name": "creatinine_clearance",
            "domain": "real",
            "kind": "lab_value",
            "unit": "mL/min",
            "definition": "Creatinine clearance by Cockcroft-Gault.",
        },
        {"name": "has_t1d", "domain": "bool", "kind": "diagnosis", "definition": "Type 1 diabetes."},
    ],
    "cohorts": [
        {
            "id": "main",
            "inclusion": [
                {
                    "id": "i1",
                    "text": "age >= 18",
                    "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": 18},
                },
                {
                    "id": "i2",
                    "text": "creatinine <= 1.5 mg/dL",
                    "formula": {"op": "cmp", "lhs": "serum_creatinine", "rel": "le", "rhs": 1.5},
                },
            ],
            "exclusion": [
                {
                    "id": "e1",
                    "text": "HbA1c > 97 mmol/mol",
                    "formula": {"op": "cmp", "lhs": "hba1c_mmol_mol", "rel": "gt", "rhs": 97},
                },
                {
                    "id": "e2",
                    "text": "CrCl < 30",
                    "formula": {"op": "cmp", "lhs": "creatinine_clearance", "rel": "lt", "rhs": 30},
                },
                {"id": "e3", "text": "type 1 diabetes", "formula": "has_t1d"},
            ],
        }
    ],
}


@pytest.fixture(scope="module")
def records(fhir_topics, tmp_path_factory):
    path = write_bundle(
        tmp_path_factory.mktemp("b") / "b.json",
        topic_resources(["trec-202124", "trec-202129", "trec-202132", "trec-20211"]),
    )
    return {r.patient_id: r for r in load_source(str(path), AT).records}


def test_coded_lab_resolves_its_atom_with_the_conversion_in_the_evidence(records):
    program = load_program(PROGRAM)
    out = resolve_coded(program, records["trec-202129"], load_code_map())
    got = {r.atom: r for r in out.resolutions}
    creat = got["serum_creatinine"]
    assert creat.value == 0.9004 and creat.status == "observed"
    assert creat.evidence_source == "Observation/obs-202129-creatinine"
    assert creat.evidence == (
        "Observation/obs-202129-creatinine: creatinine 0.9004 mg/dL (converted from 79.6 umol/L), 2024-04-30"
    )
    assert got["hba1c_mmol_mol"].value == pytest.approx(100.0, abs=0.1)  # 11.3 % NGSP -> IFCC
    assert "(converted from 11.3 %)" in got["hba1c_mmol_mol"].evidence
    assert got["age_years"].value == 24 and got["age_years"].evidence_source == "Patient/trec-202129"
    assert "serum_creatinine" not in out.left_for_miner and "hba1c_mmol_mol" not in out.left_for_miner
    assert set(out.left_for_miner) == {"creatinine_clearance", "has_t1d"}  # CrCl is not creatinine


def test_most_recent_value_inside_the_window_and_refusals_noted(records):
    program = load_program(PROGRAM)
    out = resolve_coded(program, records["trec-202132"], load_code_map())
    creat = next(r for r in out.resolutions if r.atom == "serum_creatinine")
    assert creat.value == 3.6 and creat.evidence_source == "Observation/obs-202132-creatinine"
    none = resolve_coded(program, records["trec-20211"], load_code_map())  # no coded labs
    assert "serum_creatinine" in none.left_for_miner
    assert "no final coded Observation on or before 2024-05-01" in none.notes["serum_creatinine"]


def test_coded_values_reach_the_decision(records):
    program = load_program(PROGRAM)

    def decision(rec):
        out = resolve_coded(program, rec, load_code_map())
        patient = ResolvedPatient(
            patient_id=rec.patient_id,
            trial_id=program.trial_id,
            program_hash=program.content_hash,
            resolutions=out.resolutions,
        )
        return decide(program, patient).decision

    adult = records["trec-202132"].model_copy(update={"age_years": 40})  # only creatinine 3.6 mg/dL fails
    assert decision(adult) == "ineligible"
    assert decision(records["trec-202124"]) == "eligible"  # 0.5 mg/dL; unresolved exclusions assumed absent


def test_partial_birth_date_gives_bounds(records):
    rec = records["trec-20211"].model_copy(
        update={"birth_date": "1979", "age_years": None, "age_range": (44, 45)}
    )
    out = resolve_coded(load_program(PROGRAM), rec, load_code_map())
    age = next(r for r in out.resolutions if r.atom == "age_years")
    assert age.value is None and (age.bounds.lo, age.bounds.hi) == (44, 45)


def test_age_at_an_event_is_left_for_the_miner(records):
    data = {**PROGRAM, "atoms": [dict(a) for a in PROGRAM["atoms"]]}
    data["atoms"][0] = {**data["atoms"][0], "name": "age_at_diagnosis", "definition": "Age when diagnosed."}
    data["cohorts"] = [
        {
            "id": "main",
            "inclusion": [
                {
                    "id": "i1",
                    "text": "x",
                    "formula": {"op": "cmp", "lhs": "age_at_diagnosis", "rel": "ge", "rhs": 18},
                }
            ],
        }
    ]
    data["atoms"] = data["atoms"][:1]
    out = resolve_coded(load_program(data), records["trec-202129"], load_code_map())
    assert out.left_for_miner == ["age_at_diagnosis"] and "age at an event" in out.notes["age_at_diagnosis"]
