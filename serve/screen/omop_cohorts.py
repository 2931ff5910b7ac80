"""`verdict screen --omop ... --omop-write-cohorts`: a recorded screening run's eligible pairs into the
OMOP database's results schema (`verdict.data_gen.omop.cohorts`: one cohort definition per trial and
eligible tier, ids from the site's configured range, a run replacing only its own rows).

The admin role applies as for the FHIR write-back: the run's results are asked of the service's
admin-only endpoint (`GET /v1/screenings/{id}/research-subjects`: 403 for any other role, before
anything is written), and only the pairs the service recorded for the run are written; the policy
name comes from the run's record. Without the flag nothing is written.
"""

from __future__ import annotations

import datetime as dt

from verdict.core.cli_errors import fail
from verdict.core.errors import VerdictError
from verdict.data_gen.omop.cohorts import ScreenedPair, person_id_of, write_cohorts
from verdict.data_gen.omop.config import OmopConfig

from .research_subjects import PAIR, pair_value
from .write_back import fetch_subjects

TARGET = "the OMOP cohort table"


def _policy(service_url: str, screening_id: str, key: str, timeout: float) -> str:
    import httpx  # heavy optional dependency: httpx (serve extra)

    target = f"{service_url.rstrip('/')}/v1/screenings/{screening_id}"
    try:
        r = httpx.get(target, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    except httpx.HTTPError as e:
        fail(f"the service at {service_url} did not answer: {type(e).__name__}")
    if r.status_code != 200:
        fail(f"HTTP {r.status_code} asking the service for screening {screening_id}; nothing was written")
    return r.json()["policy"]["name"]


def write_omop_cohorts(
    service_url: str, result: dict, key: str, timeout: float, cfg: OmopConfig, at: dt.date
) -> str:
    """Write the run's eligible pairs; returns the line to print (ids and counts, no patient data)."""
    sid = result["screening_id"]
    recorded = {
        i["value"]
        for rs in fetch_subjects(service_url, sid, key, timeout, TARGET)
        for i in rs["identifier"]
        if i.get("system") == PAIR
    }
    rows = result["rows"]  # every ranked row: the command never sets `max_rows`
    try:
        pairs = [
            ScreenedPair(r["trial_id"], person_id_of(r["patient_id"]), r["tier"])
            for r in rows
            if pair_value(r["trial_id"], r["patient_id"]) in recorded
        ]
        done = write_cohorts(
            cfg, pairs, policy=_policy(service_url, sid, key, timeout), screening_id=sid, screened_on=at
        )
    except VerdictError as e:  # CohortWriteError, EgressRefused, OmopSourceError: nothing was written
        fail(str(e))
    ids = ", ".join(f"{trial} {tier}={cid}" for (trial, tier), cid in sorted(done.definitions.items()))
    return (
        f"wrote cohorts to {cfg.results_schema}.cohort: {done.inserted} rows inserted, {done.deleted} "
        f"replaced ({ids})"
    )
