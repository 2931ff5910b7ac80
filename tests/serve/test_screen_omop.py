"""`verdict screen --omop` against the real service and a real OMOP CDM 5.4 database (PostgreSQL, the
OHDSI DDL), with the scripted formalizer (real HTTP) answering the value miner.

The OMOP path must decide as the plain-text and FHIR paths do for the same topics (decision, tier,
distance), with the coded labs and the age never asked of the miner and their evidence naming the
row (`measurement/...`, the conversion shown); a database host off the egress allowlist is refused
before any connection; the cohort write-back needs the flag and an admin key, and a second run
replaces its own rows and nothing else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.fixtures.fhir_server.data import AT, topic_resources, write_bundle
from tests.fixtures.omop.data import topic_id
from tests.serve.conftest import verdict_command
from tests.serve.test_screen import recorded_source
from tests.serve.test_screen_fhir import (  # noqa: F401 - the FHIR screen's trials, script and fixtures
    CODED_ATOMS,
    SCRIPT,
    TOPICS,
    asked,
    outcome,
    plain,
    screen_cli,
    service,
    texts,
)

COHORT_IDS = {"first": 910000, "last": 910099}


def _cli(args: list[str], svc, tmp_path, name: str, role: str = "match"):
    """`verdict screen` with `role`'s key; $VERDICT_OMOP_PASSWORD is set by the omop_db fixture."""
    return screen_cli(args, svc, tmp_path, name, fhir_token=None, role=role)


def _by_topic(body: dict) -> dict:
    return {(topic_id(p), t): v for (p, t), v in outcome(body).items()}


def test_omop_decides_as_text_and_fhir_with_coded_labs_not_mined(
    service,  # noqa: F811  (the imported fixtures)
    scripted,
    plain,  # noqa: F811
    texts,  # noqa: F811
    omop_db,
    tmp_path,
):
    bundle = write_bundle(tmp_path / "b.json", topic_resources(TOPICS))
    omop, fhir = {}, {}
    scripted.reset()
    for trial in ("T-RENAL", "T-A1C"):
        r, body = _cli(["--trial", trial, "--omop", omop_db.url], service, tmp_path, f"omop-{trial}")
        assert r.returncode == 0, r.stderr
        assert body["pairs"] == len(TOPICS) and not body["failures"]
        assert all(texts[t][:40] not in r.stdout + r.stderr for t in TOPICS)
        omop.update(_by_topic(body))
        r, body_fhir = _cli(["--trial", trial, "--fhir-bundle", str(bundle)], service, tmp_path, f"f-{trial}")
        assert r.returncode == 0, r.stderr
        fhir.update(outcome(body_fhir))
        if trial == "T-RENAL":
            renal = body
    assert omop == plain == fhir  # the same decision, tier and distance for every pair
    assert recorded_source(service, renal) == {"kind": "omop", "label": omop_db.name}
    # the coded labs and the age were not asked of the miner; the evidence names the row, converted
    assert not set(asked(scripted, texts["trec-202129"])) & CODED_ATOMS
    row = next(r for r in renal["rows"] if r["patient_id"] == "202129")
    with service.client("audit") as a:
        rec = a.get(row["links"]["decision"]).json()
        page = a.get(row["links"]["page"]).text
    res = {r["atom"]: r for r in rec["artifacts"]["patient"]["resolutions"]}
    assert res["serum_creatinine"]["evidence_source"] == "measurement/2129002"
    assert "0.9004 mg/dL (converted from 79.6 umol/L)" in res["serum_creatinine"]["evidence"]
    assert res["age_years"]["evidence_source"] == "person/202129"
    assert rec["artifacts"]["fhir"]["patient"] == "person/202129"
    assert "measurement/2129002" in page and "converted from 79.6 umol/L" in page
    # one person, the patient direction (a person-id file)
    ids = tmp_path / "ids.txt"
    ids.write_text("# the one person\n202129\n")
    r, body = _cli(["--omop", omop_db.url, "--omop-person-ids", str(ids)], service, tmp_path, "one")
    assert r.returncode == 0, r.stderr
    assert body["direction"] == "patient" and _by_topic(body) == {
        k: v for k, v in plain.items() if k[0] == "trec-202129"
    }


def test_a_database_host_off_the_allowlist_is_refused_before_a_connection(
    service,  # noqa: F811  (the imported fixture)
    scripted,
    tmp_path,
):
    asked_before = len(scripted.requests)
    for url in (
        "postgresql://reader@10.255.255.1:5432/omop",
        "postgresql://reader@cdm.elsewhere.example/omop",
    ):
        r, body = _cli(["--trial", "T-RENAL", "--omop", url], service, tmp_path, "refused")
        assert r.returncode == 2 and "refused: an OMOP database connection" in r.stderr and body is None, (
            r.stderr
        )
    assert len(scripted.requests) == asked_before


def cohort_rows(db) -> list[tuple]:
    return db.query(
        "SELECT c.cohort_definition_id, c.subject_id, c.cohort_start_date, c.cohort_end_date, m.tier "
        "FROM results.cohort c LEFT JOIN results.verdict_cohort_definition m USING (cohort_definition_id) "
        "ORDER BY 1, 2"
    )


def test_cohort_write_back_needs_the_flag_and_an_admin_key_and_replaces_its_own_rows(
    service,  # noqa: F811  (the imported fixture)
    omop_db,
    tmp_path,
):
    atlas = (17, 202124, AT, AT)  # an ATLAS cohort of the site: never touched
    omop_db.insert(
        "cohort", "cohort_definition_id, subject_id, cohort_start_date, cohort_end_date", [atlas], "results"
    )
    config = tmp_path / "omop.yaml"
    config.write_text(json.dumps({"cohort_ids": COHORT_IDS}))
    args = ["--trial", "T-RENAL", "--omop", omop_db.url, "--omop-config", str(config)]
    r, _ = _cli(args, service, tmp_path, "no-flag", role="admin")  # no flag: nothing written
    assert r.returncode == 0, r.stderr
    assert omop_db.query("SELECT * FROM results.cohort") == [atlas]
    r, body = _cli([*args, "--omop-write-cohorts"], service, tmp_path, "match-key")  # a match key: refused
    assert r.returncode == 2 and "admin role" in r.stderr and "nothing was written" in r.stderr, r.stderr
    assert body is not None and omop_db.query("SELECT * FROM results.cohort") == [atlas]
    no_range = ["--trial", "T-RENAL", "--omop", omop_db.url, "--omop-write-cohorts"]
    r, _ = _cli(no_range, service, tmp_path, "no-range", role="admin")
    assert r.returncode == 2 and "no cohort id range is configured" in r.stderr, r.stderr

    r, body = _cli([*args, "--omop-write-cohorts"], service, tmp_path, "write", role="admin")
    assert r.returncode == 0 and "wrote cohorts to results.cohort" in r.stderr, r.stderr
    eligible = {(int(x["patient_id"]), x["tier"]) for x in body["rows"] if x["decision"] == "eligible"}
    first = cohort_rows(omop_db)
    assert {(s, t) for _, s, _, _, t in first if t} == eligible and atlas + (None,) in first
    assert all(COHORT_IDS["first"] <= c <= COHORT_IDS["last"] for c, *_ in first if c != 17)
    mapping = omop_db.query("SELECT trial_id, policy, tier FROM results.verdict_cohort_definition ORDER BY 3")
    assert mapping == [("T-RENAL", "prescreen", "eligible"), ("T-RENAL", "prescreen", "eligible_to_confirm")]
    r, _ = _cli([*args, "--omop-write-cohorts"], service, tmp_path, "again", role="admin")
    assert r.returncode == 0, r.stderr
    assert cohort_rows(omop_db) == first  # its own rows replaced by the same; ATLAS's untouched


def test_match_batch_reads_the_persons_once_into_its_patients_file(omop_db, tmp_path):
    from verdict.data_gen.sources import load_patients

    from tests.serve.test_match_batch import scripted_serve_config

    trials = tmp_path / "trials.jsonl"
    trials.write_text(
        json.dumps({"nct_id": "NCT01", "title": "t", "inclusion": "Adults", "exclusion": ""}) + "\n"
    )
    base = [*verdict_command(), "match", "batch", "--config", str(scripted_serve_config(tmp_path))]
    base += ["--trials", str(trials), "--at", AT.isoformat(), "--no-submit"]

    def batch(url: str, out: Path) -> subprocess.CompletedProcess:
        cmd = [*base, "--omop", url, "--out", str(out)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)

    out = tmp_path / "batch"
    r = batch(omop_db.url, out)
    assert r.returncode == 0 and "4 pairs (4 patients x 1 trials)" in r.stderr, r.stderr
    loaded = load_patients(out / "omop-patients.jsonl")
    assert not loaded.problems
    assert sorted(p.patient_id for p in loaded.items) == ["20211", "202124", "202129", "202132"]
    record = next(p.fhir for p in loaded.items if p.patient_id == "202129")
    assert record["patient_source"] == "person/202129" and "measurement/2129002" in json.dumps(
        record["facts"]
    )
    again = batch(omop_db.url, out)  # a rerun resumes: the database is not read again
    assert again.returncode == 0 and "reusing the OMOP patients read earlier" in again.stderr, again.stderr
    refused = batch("postgresql://reader@cdm.elsewhere.example/omop", tmp_path / "other")
    assert refused.returncode == 2 and "refused: an OMOP database connection" in refused.stderr, (
        refused.stderr
    )
