"""`verdict match batch --omop URL`: the OMOP persons as the batch's patients file.

Read once (`verdict.data_gen.omop`: egress allowlist before any connection, bad rows reported by
table and id) into `OUT/omop-patients.jsonl`, one `verdict.fhir_patient/v1` record per line (the
lines `--patients` reads), so the shards decide from their coded facts as `verdict screen --omop`
does. A rerun on the same folder resumes from that file: the database is not read again, so the
plan's population stays the one it was made for.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

from verdict.core.cli_errors import fail
from verdict.data_gen.fhir.cli import read_records
from verdict.data_gen.fhir.show import screenable, write_records
from verdict.data_gen.omop.config import OmopConfig
from verdict.data_gen.omop.sources import load_omop

PATIENTS_FILE = "omop-patients.jsonl"


def omop_patients_file(out: Path, cfg: OmopConfig, at: dt.date, say: Callable[[str], None]) -> Path:
    """`OUT/omop-patients.jsonl`: the screenable persons, read once (a rerun reuses the file)."""
    path = Path(out) / PATIENTS_FILE
    if path.is_file():
        say(f"reusing the OMOP patients read earlier ({path}); a new read needs a new batch folder")
        return path
    loaded = read_records(load_omop, cfg, at)
    kept = screenable(loaded, say, "omop")
    if not kept:
        fail(f"no person with a note to screen in {loaded.source}")
    write_records(kept, path)
    say(f"read {len(kept)} persons from {loaded.source} into {path}")
    return path
