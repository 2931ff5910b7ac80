"""Screening results into the CDM results schema, where OHDSI tools (ATLAS, HADES) read cohorts.

Each (trial, policy, eligible tier) is one cohort definition: "eligible" and "eligible with
assumptions to confirm". Its id comes from the range the site configured (`cohort_ids`: kept apart
from its ATLAS ids); an id that already has rows in `cohort` but is not Verdict's is never taken. The
mapping table `verdict_cohort_definition` (created in the results schema) names each id's trial,
policy and tier, and the screening that wrote it last. A subject's rows carry the screening date as
cohort_start_date and cohort_end_date.

A run replaces its own rows and nothing else: for each trial it screened, the rows of its two
definitions for the persons it screened are deleted and the eligible ones inserted, in one
transaction; other definitions, other persons and other tables are untouched.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from .config import OmopConfig
from .connect import connect, db_label, pg_problem
from .errors import CohortWriteError

TIERS = {"eligible": "eligible", "eligible_to_confirm": "eligible with assumptions to confirm"}
MAPPING = "verdict_cohort_definition"


@dataclass(frozen=True)
class ScreenedPair:
    trial_id: str
    person_id: int
    tier: str  # eligible | eligible_to_confirm | near_miss | ineligible | undetermined


@dataclass
class CohortsWritten:
    definitions: dict[tuple[str, str], int] = field(default_factory=dict)  # (trial, tier) -> id
    deleted: int = 0
    inserted: int = 0


def person_id_of(patient_id: str) -> int:
    try:
        return int(patient_id)
    except ValueError:
        raise CohortWriteError(
            f"patient id '{patient_id[:40]}' is not an OMOP person_id: only patients read from the OMOP "
            "database can be written to its cohort table"
        ) from None


def _ids(conn, cfg: OmopConfig, results: sql.Identifier, trial: str, policy: str) -> dict[str, int]:
    """tier -> cohort_definition_id of a trial under a policy: the mapped ones, new ones from the range."""
    mapped = dict(
        conn.execute(
            sql.SQL(
                "SELECT tier, cohort_definition_id FROM {r}.{m} WHERE trial_id = %s AND policy = %s"
            ).format(r=results, m=sql.Identifier(MAPPING)),
            (trial, policy),
        ).fetchall()
    )
    taken = {r[0] for r in conn.execute(sql.SQL("SELECT cohort_definition_id FROM {r}.{m}").format(
        r=results, m=sql.Identifier(MAPPING)))}  # fmt: skip
    candidate = cfg.cohort_ids.first
    for tier in TIERS:
        if tier in mapped:
            continue
        while True:
            if candidate > cfg.cohort_ids.last:
                raise CohortWriteError(
                    f"the cohort id range {cfg.cohort_ids.first}-{cfg.cohort_ids.last} is used up "
                    "(cohort_ids in the OMOP config); nothing was written"
                )
            foreign = conn.execute(
                sql.SQL("SELECT 1 FROM {r}.cohort WHERE cohort_definition_id = %s LIMIT 1").format(r=results),
                (candidate,),
            ).fetchone()
            if candidate not in taken and foreign is None:  # not ours, and nobody else's rows
                break
            candidate += 1
        mapped[tier] = candidate
        taken.add(candidate)
    return mapped


def write_cohorts(
    cfg: OmopConfig,
    pairs: list[ScreenedPair],
    *,
    policy: str,
    screening_id: str,
    screened_on: dt.date,
) -> CohortsWritten:
    """Write the eligible pairs of one screening run into `cfg.results_schema`.cohort (see module)."""
    if cfg.cohort_ids is None:
        raise CohortWriteError(
            "no cohort id range is configured: set cohort_ids {first, last} in the OMOP config, a block "
            "the site's ATLAS does not use; nothing was written"
        )
    results = sql.Identifier(cfg.results_schema)
    mapping = sql.Identifier(MAPPING)
    done = CohortsWritten()
    by_trial: dict[str, list[ScreenedPair]] = {}
    for p in pairs:
        by_trial.setdefault(p.trial_id, []).append(p)
    try:
        with connect(cfg) as conn, conn.transaction():
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {r}.{m} (cohort_definition_id integer PRIMARY KEY, "
                    "trial_id text NOT NULL, policy text NOT NULL, tier text NOT NULL, "
                    "cohort_definition_name text NOT NULL, screening_id text NOT NULL, "
                    "written_at timestamptz NOT NULL DEFAULT now(), UNIQUE (trial_id, policy, tier))"
                ).format(r=results, m=mapping)
            )
            conn.execute(sql.SQL("LOCK TABLE {r}.{m} IN EXCLUSIVE MODE").format(r=results, m=mapping))
            for trial, screened in sorted(by_trial.items()):
                ids = _ids(conn, cfg, results, trial, policy)
                persons = sorted({p.person_id for p in screened})
                deleted = conn.execute(
                    sql.SQL(
                        "DELETE FROM {r}.cohort WHERE cohort_definition_id = ANY(%s) AND subject_id = ANY(%s)"
                    ).format(r=results),
                    (list(ids.values()), persons),
                )
                done.deleted += deleted.rowcount
                eligible = sorted({(ids[p.tier], p.person_id) for p in screened if p.tier in TIERS})
                conn.cursor().executemany(
                    sql.SQL(
                        "INSERT INTO {r}.cohort (cohort_definition_id, subject_id, cohort_start_date, "
                        "cohort_end_date) VALUES (%s, %s, %s, %s)"
                    ).format(r=results),
                    [(cid, pid, screened_on, screened_on) for cid, pid in eligible],
                )
                done.inserted += len(eligible)
                for tier, cid in ids.items():
                    name = f"Verdict {trial}: {TIERS[tier]} (policy {policy})"
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {r}.{m} (cohort_definition_id, trial_id, policy, tier, "
                            "cohort_definition_name, screening_id) VALUES (%s, %s, %s, %s, %s, %s) "
                            "ON CONFLICT (cohort_definition_id) DO UPDATE SET "
                            "screening_id = EXCLUDED.screening_id, written_at = now()"
                        ).format(r=results, m=mapping),
                        (cid, trial, policy, tier, name, screening_id),
                    )
                    done.definitions[(trial, tier)] = cid
    except psycopg.Error as e:  # permissions, a missing cohort table: named by PostgreSQL, no row content
        raise CohortWriteError(
            f"writing cohorts to {db_label(cfg.url)} ({cfg.results_schema}) failed, nothing was written: "
            + pg_problem(e)
        ) from None
    return done
