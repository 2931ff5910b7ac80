"""Patients from a live OMOP CDM 5.4 database (real PostgreSQL, the OHDSI DDL): the same record and
rules as FHIR; bad rows reported by table and id; a host off the egress allowlist refused before any
connection."""

from __future__ import annotations

import socket
import threading

import pytest
from verdict.core.program import TrialProgram
from verdict.data_gen.fhir.resolve import coded_resolutions
from verdict.data_gen.formalizer.errors import EgressRefused
from verdict.data_gen.omop.config import OmopConfig
from verdict.data_gen.omop.connect import check_egress
from verdict.data_gen.omop.errors import OmopSourceError
from verdict.data_gen.omop.sources import load_omop

from tests.fixtures.fhir_server.data import AT
from tests.fixtures.omop.data import CREATININE, EHR, MG_DL

PROGRAM = {
    "trial_id": "T-RENAL",
    "atoms": [
        {"name": "age_years", "domain": "int", "kind": "demographic", "definition": "Age.", "unit": "years"},
        {
            "name": "serum_creatinine",
            "domain": "real",
            "kind": "lab_value",
            "definition": "Most recent serum creatinine.",
            "unit": "mg/dL",
        },
    ],
    "cohorts": [
        {
            "id": "main",
            "inclusion": [
                {
                    "id": "i1",
                    "text": "creatinine",
                    "formula": {"op": "cmp", "lhs": "serum_creatinine", "rel": "le", "rhs": 1.5},
                }
            ],
            "exclusion": [],
        }
    ],
}


def cfg(db, **kw) -> OmopConfig:
    return OmopConfig(url=db.url, **kw)


def test_persons_read_into_the_fhir_record_with_coded_facts_and_conversions(omop_db):
    result = load_omop(cfg(omop_db, person_ids=[202129, 202124]), AT)
    assert result.kind == "omop" and "@" not in result.source and not result.problems
    assert [r.patient_id for r in result.records] == ["202124", "202129"]
    rec = result.records[1]
    assert (rec.age_years, rec.gender, rec.patient_ref) == (24, "male", "person/202129")
    assert [d.id for d in rec.documents] == ["note/2021290"] and "A1c: 11.3%" in rec.documents[0].text
    by_row = {f.resource: f for f in rec.facts}
    assert by_row["condition_occurrence/2129101"].canonical == "type_2_diabetes"
    assert by_row["drug_exposure/2129201"].canonical == "metformin"
    (creat,) = rec.conversions()  # 79.6 umol/L, the unit from the code map's unit_concepts (8749)
    assert creat.resource == "measurement/2129002"
    assert (creat.converted.value, creat.converted.unit, creat.converted.rule) == (
        0.9004,
        "mg/dL",
        "molar mass 113.12 g/mol",
    )
    coded = coded_resolutions(TrialProgram.model_validate(PROGRAM), rec)
    res = {r.atom: r for r in coded.resolutions}
    assert res["serum_creatinine"].evidence_source == "measurement/2129002"
    assert res["serum_creatinine"].evidence == (
        "measurement/2129002: creatinine 0.9004 mg/dL (converted from 79.6 umol/L), 2024-04-30"
    )
    assert res["age_years"].evidence_source == "person/202129" and res["age_years"].value == 24


def test_a_cohort_limits_the_population(omop_db):
    omop_db.insert("cohort", "cohort_definition_id, subject_id, cohort_start_date, cohort_end_date",
                   [(77, 202132, AT, AT), (77, 20211, AT, AT)], schema="results")  # fmt: skip
    result = load_omop(cfg(omop_db, cohort_id=77), AT)
    assert [r.patient_id for r in result.records] == ["20211", "202132"]
    newest = next(f for f in result.records[1].facts if f.resource == "measurement/2132001")
    assert newest.converted.rule == "same unit"
    assert load_omop(cfg(omop_db, person_ids=[1, 202124]), AT).problems == [
        "person/1: not in cdm.person; not read"
    ]


def test_a_bad_row_is_reported_by_table_and_id_and_the_others_load(omop_db):
    secret = "Zanzibar-SECRET"
    omop_db.insert(
        "person",
        "person_id, gender_concept_id, year_of_birth, month_of_birth, day_of_birth, race_concept_id, "
        "ethnicity_concept_id",
        [(990001, 8532, 1970, 13, 40, 0, 0)],
    )
    omop_db.insert(
        "note",
        "note_id, person_id, note_date, note_type_concept_id, note_class_concept_id, note_text, "
        "encoding_concept_id, language_concept_id",
        [
            (99000101, 990001, AT, 0, 0, "Creatinine 2.2 mg/dL. " + secret, 0, 0),
            (99000102, 990001, AT, 0, 0, "  ", 0, 0),
        ],
    )
    cols = (
        "measurement_id, person_id, measurement_concept_id, measurement_date, measurement_type_concept_id, "
        "value_as_number, unit_concept_id, unit_source_value"
    )
    omop_db.insert(
        "measurement",
        cols,
        [
            (99000201, 990001, CREATININE, AT, EHR, float("nan"), MG_DL, None),  # not a number
            (99000202, 990001, CREATININE, "2024-03-01", EHR, 4321.5, 0, secret),  # a unit nobody knows
            (99000203, 990001, CREATININE, AT, EHR, 987654, MG_DL, None),  # implausible
            (99000204, 990001, CREATININE, "2024-04-01", EHR, 1.1, MG_DL, None),  # fine
        ],
    )
    result = load_omop(cfg(omop_db, person_ids=[990001]), AT)
    (rec,) = result.records
    problems = "\n".join(rec.problems)
    for row, column in (
        ("person/990001", "month_of_birth/day_of_birth"),
        ("note/99000102", "note_text is empty"),
        ("measurement/99000201", "value_as_number"),
        ("measurement/99000202", "unit_concept_id/unit_source_value"),
        ("measurement/99000203", "value of creatinine is above the plausible maximum"),
    ):
        assert f"{row}: {column}" in problems, problems
    assert secret not in problems and "4321" not in problems and "987654" not in problems
    assert rec.birth_date == "1970" and rec.age_range == (53, 54)
    assert [d.id for d in rec.documents] == ["note/99000101"]
    coded = coded_resolutions(TrialProgram.model_validate(PROGRAM), rec)
    assert [r.evidence_source for r in coded.resolutions if r.atom == "serum_creatinine"] == [
        "measurement/99000204"
    ]


class Listener:
    """A TCP port that counts the connections made to it (none may be)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port, self.accepted, self.stop = self.sock.getsockname()[1], 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def test_a_database_host_off_the_allowlist_is_refused_before_a_connection(omop_db, monkeypatch):
    monkeypatch.delenv("VERDICT_EGRESS_ALLOW", raising=False)
    listener = Listener()
    try:
        urls = [
            f"postgresql://reader@127.0.0.1:{listener.port}/omop",  # loopback, but the site turned it off
            f"postgresql://reader@db.hospital.example:{listener.port}/omop?hostaddr=127.0.0.1",
            f"postgresql://reader@localhost,db.elsewhere.example:{listener.port}/omop",
        ]
        for i, url in enumerate(urls):
            config = OmopConfig(url=url, egress={"allow_loopback": i > 0})
            with pytest.raises(EgressRefused, match="refused: an OMOP database connection"):
                load_omop(config, AT)
    finally:
        listener.close()
    assert listener.accepted == 0
    check_egress(cfg(omop_db))  # the test database (loopback) passes
    with pytest.raises(OmopSourceError, match="carries a password") as e:
        load_omop(OmopConfig(url="postgresql://reader:hunter2@127.0.0.1/omop"), AT)
    assert "hunter2" not in str(e.value)


def test_omop_load_prints_what_was_read_by_row_and_writes_the_records(omop_db, tmp_path):
    import json
    import subprocess

    from tests.serve.conftest import verdict_command

    ids = tmp_path / "ids.txt"
    ids.write_text("202129\n")
    out = tmp_path / "records.jsonl"
    cmd = [*verdict_command(), "omop", "load", omop_db.url, "--at", AT.isoformat(), "--out", str(out)]
    r = subprocess.run(
        [*cmd, "--person-ids", str(ids)], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "person/202129: age 24 at 2024-05-01" in r.stdout
    assert "fact measurement/2129002: observation creatinine 79.6 umol/L" in r.stdout
    assert "converted: 0.9004 mg/dL (molar mass 113.12 g/mol)" in r.stdout and "A1c" not in r.stdout
    (line,) = out.read_text().splitlines()
    assert json.loads(line)["patient_source"] == "person/202129"
    ids.write_text("202129\nnot-an-id\n")
    bad = subprocess.run(
        [*cmd, "--person-ids", str(ids)], capture_output=True, text=True, timeout=120, check=False
    )
    assert bad.returncode == 2 and "line 2: not a person_id" in bad.stderr, bad.stderr
