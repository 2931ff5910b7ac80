"""The cohort write-back into a real CDM results schema: ids from the site's range (never an id with
someone else's rows), a mapping table naming trial, policy and tier, and a second run replacing its
own rows and nothing else."""

from __future__ import annotations

import datetime as dt

import pytest
from verdict.data_gen.omop.cohorts import ScreenedPair, write_cohorts
from verdict.data_gen.omop.config import OmopConfig
from verdict.data_gen.omop.errors import CohortWriteError

COHORT = "cohort_definition_id, subject_id, cohort_start_date, cohort_end_date"
DAY1, DAY2 = dt.date(2024, 5, 1), dt.date(2024, 6, 1)


def rows(db) -> set[tuple]:
    return set(db.query(f"SELECT {COHORT} FROM results.cohort"))


def test_a_second_run_replaces_its_own_rows_and_nothing_else(omop_db):
    atlas = [(5, 202124, DAY1, DAY1), (9000, 202129, DAY1, DAY1)]  # ATLAS's, one inside our range
    omop_db.insert("cohort", COHORT, atlas, schema="results")
    cfg = OmopConfig(url=omop_db.url, cohort_ids={"first": 9000, "last": 9010})
    first = write_cohorts(
        cfg,
        [
            ScreenedPair("T-RENAL", 202124, "eligible"),
            ScreenedPair("T-RENAL", 202129, "eligible_to_confirm"),
            ScreenedPair("T-RENAL", 202132, "ineligible"),
            ScreenedPair("T-A1C", 202124, "eligible"),
        ],
        policy="prescreen",
        screening_id="scr-1",
        screened_on=DAY1,
    )
    ids = first.definitions
    assert 9000 not in ids.values() and set(ids.values()) == {9001, 9002, 9003, 9004}
    renal, renal_k, a1c = (
        ids[("T-RENAL", "eligible")],
        ids[("T-RENAL", "eligible_to_confirm")],
        ids[("T-A1C", "eligible")],
    )
    assert rows(omop_db) == {
        *atlas,
        (renal, 202124, DAY1, DAY1),
        (renal_k, 202129, DAY1, DAY1),
        (a1c, 202124, DAY1, DAY1),
    }
    mapping = omop_db.query(
        "SELECT cohort_definition_id, trial_id, policy, tier FROM results.verdict_cohort_definition"
    )
    assert (renal_k, "T-RENAL", "prescreen", "eligible_to_confirm") in mapping and len(mapping) == 4

    # T-RENAL again for two of its patients: their rows are replaced; T-A1C's, 202132's and ATLAS's stay
    omop_db.insert("cohort", COHORT, [(renal, 202132, DAY1, DAY1)], schema="results")  # from an earlier run
    second = write_cohorts(
        cfg,
        [ScreenedPair("T-RENAL", 202124, "near_miss"), ScreenedPair("T-RENAL", 202129, "eligible")],
        policy="prescreen",
        screening_id="scr-2",
        screened_on=DAY2,
    )
    assert second.definitions == {k: v for k, v in ids.items() if k[0] == "T-RENAL"}  # the same ids
    assert (second.deleted, second.inserted) == (2, 1)
    assert rows(omop_db) == {
        *atlas,
        (a1c, 202124, DAY1, DAY1),
        (renal, 202132, DAY1, DAY1),
        (renal, 202129, DAY2, DAY2),
    }  # fmt: skip


def test_writing_needs_a_configured_range_and_omop_person_ids(omop_db):
    before = rows(omop_db)
    with pytest.raises(CohortWriteError, match="no cohort id range is configured"):
        write_cohorts(
            OmopConfig(url=omop_db.url),
            [ScreenedPair("T-RENAL", 202124, "eligible")],
            policy="prescreen",
            screening_id="scr-3",
            screened_on=DAY1,
        )
    cfg = OmopConfig(url=omop_db.url, cohort_ids={"first": 9100, "last": 9100})  # one id: two are needed
    with pytest.raises(CohortWriteError, match="range 9100-9100 is used up"):
        write_cohorts(
            cfg, [ScreenedPair("T-NEW", 202124, "eligible")], policy="p", screening_id="s", screened_on=DAY1
        )
    assert rows(omop_db) == before
