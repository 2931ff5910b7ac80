"""The patients `verdict screen` sends, from the source its flags choose, and how the request names
that source (`source`, recorded with the run: never a path, never credentials).

- `--note` files: one patient's documents (`note_patient`);
- `--patients FILE`: a patients JSONL through the project's one patient reader (`patients_file`);
- a record source (`record_source`): a FHIR Bundle, a Bulk Data NDJSON folder, a FHIR REST server
  (`--fhir-config`: its client config) or an OMOP CDM database, read at `--at` into the `fhir` record
  form (`RecordSource.patients`) by the readers `verdict fhir load` and `verdict omop load` use.

The FHIR and OMOP readers are imported where they are used: they need the fhir extra (fhir.resources)
and psycopg, which a screen from notes never loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import typer
from verdict.core.cli_errors import fail

if TYPE_CHECKING:
    from verdict.data_gen.fhir.rest import FhirRestConfig
    from verdict.data_gen.fhir.sources import LoadResult
    from verdict.data_gen.omop.config import OmopConfig


def screen_source(kind: str, label: str | None = None) -> dict:
    """The request's `source`; a label that the service would refuse (an odd file name) is left out."""
    from pydantic import ValidationError

    from .protocol import ScreenSource

    try:
        return ScreenSource(kind=kind, label=label).model_dump(exclude_none=True)
    except ValidationError:
        return {"kind": kind}


def server_label(url: str) -> str:
    """A FHIR server's base URL as recorded: no credentials, query or fragment."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path.rstrip('/')}"


def note_patient(patient_id: str, notes: list[Path]) -> dict:
    """One patient as a `PatientInput`: each --note file a document, named by its file name."""
    docs = [{"id": p.name, "text": p.read_text()} for p in notes]
    return {"patient_id": patient_id, "notes": docs}


def patients_file(path: Path) -> list[dict]:
    """The patients JSONL through the project's one patient reader (`verdict.data_gen.sources`), as the
    batch sends them (`patient_input`); each bad line is reported by number, never by content."""
    from verdict.data_gen.sources import load_patients

    from ..batch.match_batch import patient_input

    loaded = load_patients(path)
    for problem in loaded.problems:
        typer.echo(f"skipped: {problem}", err=True)
    if not loaded.items:
        fail(f"{path.name}: no patients")
    return [patient_input(p).model_dump(exclude_none=True) for p in loaded.items]


@dataclass(frozen=True)
class RecordSource:
    """A FHIR or OMOP source of patient records, as the flags name it."""

    kind: str  # fhir_bundle | fhir_ndjson | fhir_server | omop (the request's source kinds)
    where: str  # what is read: a bundle file, an export folder, a server's base URL, a database URL
    label: str | None  # how the request names it
    patient: str | None = None  # --fhir-patient: only this Patient id of a FHIR source
    rest: FhirRestConfig | None = None  # --fhir-config: the REST client's config
    omop: OmopConfig | None = None

    def patients(self, at: str) -> list[dict]:
        """Its screenable patients at the reference date `at`, as `PatientInput`s (`fhir` form)."""
        from verdict.data_gen.fhir.cli import read_records, reference_date

        day = reference_date(at)
        if self.omop is not None:
            from verdict.data_gen.omop.sources import load_omop  # psycopg (serve extra)

            return record_inputs(read_records(load_omop, self.omop, day), "omop")
        from verdict.data_gen.fhir.sources import load_source  # fhir.resources (fhir extra)

        loaded = read_records(load_source, self.where, day, patient=self.patient, rest=self.rest)
        return record_inputs(loaded, "fhir")


def record_inputs(loaded: LoadResult, prefix: str) -> list[dict]:
    """Each screenable record as a `PatientInput` (problems printed by row or resource id)."""
    from verdict.data_gen.fhir.show import screenable

    out = [
        {"patient_id": rec.patient_id, "fhir": rec.model_dump(mode="json")}
        for rec in screenable(loaded, lambda line: typer.echo(line, err=True), prefix)
    ]
    if not out:
        fail(f"no patient to screen in the {loaded.kind} source")
    return out


def record_source(
    fhir_bundle: Path | None,
    fhir_ndjson: Path | None,
    fhir_server: str | None,
    fhir_patient: str | None,
    fhir_config: Path | None,
    omop: str | None,
    omop_config: Path | None,
    omop_cohort: int | None,
    omop_person_ids: Path | None,
) -> RecordSource | None:
    """The one FHIR or OMOP source the flags name, its config read (None: no record source); two
    sources, or a config without its source, stop the command."""
    files = [p for p in (fhir_bundle, fhir_ndjson) if p is not None]
    if len(files) + (fhir_server is not None) + (omop is not None) > 1:
        fail("give one record source: --fhir-bundle, --fhir-ndjson, --fhir-server or --omop")
    if fhir_config is not None and fhir_server is None:
        fail("--fhir-config configures the REST client: it needs --fhir-server URL")
    if fhir_server is not None:
        return RecordSource(
            "fhir_server",
            fhir_server,
            server_label(fhir_server),
            fhir_patient,
            rest_config(fhir_config, fhir_server),
        )
    if omop is not None:
        from verdict.data_gen.omop.cli import omop_config as read_omop_config

        cfg = read_omop_config(omop, omop_config, omop_cohort, omop_person_ids)
        return RecordSource("omop", omop, urlsplit(cfg.url).path.strip("/") or None, omop=cfg)
    if files:
        kind = "fhir_bundle" if fhir_bundle is not None else "fhir_ndjson"
        return RecordSource(kind, str(files[0]), files[0].resolve().name, fhir_patient)
    return None


def rest_config(path: Path | None, server: str) -> FhirRestConfig | None:
    """The REST client config `--fhir-config` names, its base URL the server's (None: none given)."""
    if path is None:
        return None
    from verdict.data_gen.fhir.rest import load_rest_config

    return load_rest_config(path, server)  # a bad config: `error: ...` before anything
