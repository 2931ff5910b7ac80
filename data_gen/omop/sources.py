"""`load_omop`: the persons of an OMOP CDM database (all, a cohort's, or a list) as records at a
reference date, with the problems no single person owns (ids asked for that are not there). The
same `LoadResult` the FHIR sources give; `source` is the database's label (no credentials)."""

from __future__ import annotations

import datetime as dt

import psycopg
from psycopg import sql

from ..fhir.code_map import CodeMap
from ..fhir.sources import LoadResult, checked_reference_date
from .config import OmopConfig
from .connect import connect, db_label, pg_problem
from .errors import OmopSourceError
from .records import read_people, record_of


def population(conn, cfg: OmopConfig) -> list[int]:
    """The person ids to read: the config's list, its cohort's subjects, or every person."""
    if cfg.person_ids is not None:
        return sorted(set(cfg.person_ids))
    if cfg.cohort_id is not None:
        query = sql.SQL(
            "SELECT DISTINCT subject_id FROM {r}.cohort WHERE cohort_definition_id = %s ORDER BY 1"
        ).format(r=sql.Identifier(cfg.results_schema))
        return [r[0] for r in conn.execute(query, (cfg.cohort_id,))]
    query = sql.SQL("SELECT person_id FROM {cdm}.person ORDER BY 1").format(
        cdm=sql.Identifier(cfg.cdm_schema)
    )
    return [r[0] for r in conn.execute(query)]


def load_omop(cfg: OmopConfig, at: dt.date, code_map: CodeMap | None = None) -> LoadResult:
    """Read the configured population into records at `at` (egress allowlist checked first)."""
    code_map = checked_reference_date(at, code_map, OmopSourceError)
    result = LoadResult(db_label(cfg.url), "omop")
    with connect(cfg) as conn:
        conn.read_only = True
        try:
            ids = population(conn, cfg)
            for start in range(0, len(ids), cfg.batch_size):
                batch = ids[start : start + cfg.batch_size]
                people = read_people(conn, batch, cfg.cdm_schema, cfg.vocabulary, code_map)
                result.records += [record_of(p, at, code_map) for p in people]
                missing = sorted(set(batch) - {p.person_id for p in people})
                result.problems += [f"person/{i}: not in {cfg.cdm_schema}.person; not read" for i in missing]
        except psycopg.Error as e:  # a missing table or column: named by psycopg, never row content
            raise OmopSourceError(
                f"reading the OMOP database {result.source} failed: {pg_problem(e)}"
            ) from None
    if cfg.cohort_id is not None and not result.records:
        result.problems.append(f"cohort {cfg.cohort_id}: no subject in {cfg.results_schema}.cohort")
    return result
