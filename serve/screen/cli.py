"""`verdict screen`: ask the site's running matching service for a ranked screen (POST /v1/screen).

    verdict screen --url http://127.0.0.1:8000 --patient-id P1 --note discharge.txt --note labs.txt
    verdict screen --url ... --trial NCT00000001 --patients population.jsonl      # one trial, many patients
    verdict screen --url ... --fhir-server https://fhir.site.example/r4 --fhir-patient 123 --at 2024-05-01
    verdict screen --url ... --trial NCT00000001 --fhir-ndjson export/ --at 2024-05-01
    verdict screen --url ... --trial NCT00000001 --omop postgresql://reader@cdm.example/omop --at 2024-05-01

Patients from FHIR (a Bundle file, a Bulk Data NDJSON folder, or a REST server: SMART Backend
Services configured in `--fhir-config FILE`, or for development a bearer token from
$VERDICT_FHIR_TOKEN; host checked against the egress allowlist before any request) are read by
`verdict.data_gen.fhir.sources` at the reference date `--at` and sent as `PatientInput.fhir`: the service
decides from their coded labs and age without asking the miner, and mines the rest from their documents.

The key is read from an environment variable (default VERDICT_API_KEY), never from the command
line (it would land in the shell history). Patient text goes to the service only if its host
passes the egress allowlist (loopback or `VERDICT_EGRESS_ALLOW`), checked before any connection.
Prints the ranked table; `--out FILE` also writes the whole response as JSON. The request names its
source (`source`, recorded with the run): the FHIR server's base URL without credentials or query,
the export folder's, bundle's or patients file's name (never a path), `text` for --note files.

Patients from an OMOP CDM 5.4 database (`--omop URL`, password from $VERDICT_OMOP_PASSWORD, host
checked against the egress allowlist before any connection; `--omop-cohort ID` or `--omop-person-ids
FILE` limit the population) are read by `verdict.data_gen.omop` into the same record and sent the
same way. `--omop-write-cohorts` (admin key; the OMOP config's `cohort_ids` range) writes the eligible
pairs into the results schema's `cohort` table (`omop_cohorts`).

`--write-back` (with --fhir-server; the key must hold the admin role, which the service checks) writes
one ResearchSubject per ranked pair back to that FHIR server (`write_back`); without it nothing is written.

The command's steps are the functions below it, in the order it runs them: check the write-back
flags, choose the patient source (`sources.py`), build the request, check the key and the service's
host, read a record source's patients, send, report, write back.

Imports inside the commands: a part's cli module imports only typer (and light modules) at module
level, so that `verdict --help` and the other parts' commands never load this part's heavy optional
dependencies (fastapi, vLLM, httpx, psycopg, jinja2: the serve and slurm extras; verdict/cli.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from verdict.core.cli_errors import fail

from .sources import RecordSource, note_patient, patients_file, record_source, screen_source, server_label

if TYPE_CHECKING:
    from verdict.data_gen.fhir.rest import FhirRestConfig
    from verdict.data_gen.omop.config import OmopConfig

KEY_ENV = "VERDICT_API_KEY"


def screen(
    url: str = typer.Option(..., help="the matching service, e.g. http://127.0.0.1:8000"),
    patient_id: str | None = typer.Option(None, help="screen this patient against the registered trials"),
    note: list[Path] | None = typer.Option(
        None, exists=True, dir_okay=False, help="a document of the patient (repeat for several)"
    ),
    trial_ids: list[str] | None = typer.Option(None, "--trial-id", help="only these trials (repeat)"),
    trial: str | None = typer.Option(None, help="screen this trial against --patients"),
    patients: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="patients JSONL, with --trial"
    ),
    fhir_bundle: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="patients from a FHIR R4 Bundle (JSON)"
    ),
    fhir_ndjson: Path | None = typer.Option(
        None, exists=True, help="patients from a Bulk Data export (folder of *.ndjson)"
    ),
    fhir_server: str | None = typer.Option(None, help="patients from a FHIR R4 REST server (base URL)"),
    fhir_patient: str | None = typer.Option(None, help="only this Patient id of the FHIR source"),
    fhir_config: Path | None = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="REST client config YAML for --fhir-server (FhirRestConfig: `smart:` SMART Backend "
        "Services, paging, timeouts); its base_url is --fhir-server",
    ),
    omop: str | None = typer.Option(
        None,
        "--omop",
        help="patients from an OMOP CDM 5.4 database: postgresql://USER@HOST[:PORT]/DB (no password in "
        "the URL: $VERDICT_OMOP_PASSWORD or PGPASSWORD)",
    ),
    omop_config: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="OMOP config YAML (schemas, password variable, cohort_ids)"
    ),
    omop_cohort: int | None = typer.Option(None, help="only the persons of this cohort (results.cohort)"),
    omop_person_ids: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="only these person_ids (a file, one per line)"
    ),
    omop_write_cohorts: bool = typer.Option(
        False,
        "--omop-write-cohorts",
        help="also write the eligible pairs into the OMOP results schema's cohort table (the API key "
        "needs the admin role; the OMOP config sets the cohort_ids range)",
    ),
    at: str | None = typer.Option(
        None, "--at", help="reference date YYYY-MM-DD of a FHIR or OMOP source (ages)"
    ),
    policy: str | None = typer.Option(None, help="policy name (default: the service's)"),
    key_env: str = typer.Option(
        KEY_ENV, help="environment variable holding the API key (role match; admin for --write-back)"
    ),
    out: Path | None = typer.Option(None, help="also write the whole response here (JSON)"),
    research_subjects: Path | None = typer.Option(
        None, help="also write one FHIR R4 ResearchSubject per ranked pair here (NDJSON)"
    ),
    write_back: bool = typer.Option(
        False,
        "--write-back",
        help="also create or update one ResearchSubject per ranked pair on the "
        "--fhir-server (the API key needs the admin role)",
    ),
    timeout: float = typer.Option(3600, help="seconds to wait for the screen"),
) -> None:
    """One patient against the site's trials, or one trial against patients, ranked by formal
    distance (eligible; eligible with k to confirm; ineligible with |δ_E| = 1, 2, ...)."""
    import httpx  # noqa: F401 - the serve extra, loaded first: a missing one is said before anything else

    check_write_backs(write_back, fhir_server, omop_write_cohorts, omop)
    records = record_source(
        fhir_bundle,
        fhir_ndjson,
        fhir_server,
        fhir_patient,
        fhir_config,
        omop,
        omop_config,
        omop_cohort,
        omop_person_ids,
    )
    body = request_body(records, at, note, patients, patient_id, trial, trial_ids, policy)
    key = api_key(key_env)
    target = checked_target(url)
    if records is not None:  # read only once the service may receive it
        add_record_patients(body, records.patients(at), trial)
    result = post_screen(url, target, body, key, timeout)
    report(result, url, out, research_subjects)
    if omop_write_cohorts:
        write_cohorts(url, result, key, timeout, records.omop, at)
    if write_back:
        write_research_subjects(url, result, key, timeout, fhir_server, records.rest)


def check_write_backs(
    write_back: bool, fhir_server: str | None, omop_cohorts: bool, omop: str | None
) -> None:
    """A write-back needs the source it writes to: the FHIR server, the OMOP database."""
    if write_back and fhir_server is None:
        fail("--write-back writes to the FHIR server the patients came from: it needs --fhir-server URL")
    if omop_cohorts and omop is None:
        fail("--omop-write-cohorts writes to the OMOP database the patients came from: it needs --omop URL")


def request_body(
    records: RecordSource | None,
    at: str | None,
    note: list[Path] | None,
    patients: Path | None,
    patient_id: str | None,
    trial: str | None,
    trial_ids: list[str] | None,
    policy: str | None,
) -> dict:
    """The POST /v1/screen body; a record source's patients are added later (`add_record_patients`)."""
    if records is not None:
        check_record_flags(bool(note or patients or patient_id), at)
        body = record_request(records, trial, trial_ids)
    elif (patient_id is None) == (trial is None):
        fail("give --patient-id with --note, or --trial with --patients, or a FHIR source")
    elif patient_id is not None:
        body = notes_request(patient_id, note, trial_ids)
    else:
        body = patients_file_request(trial, patients)
    if policy:
        body["policy"] = policy
    return body


def check_record_flags(other_patients: bool, at: str | None) -> None:
    """A record source gives all the patients (no --note, --patients, --patient-id), read at --at."""
    if other_patients:
        fail(
            "a FHIR or OMOP source gives the patients: drop --note / --patients / --patient-id "
            "(use --fhir-patient, --omop-person-ids)"
        )
    if at is None:
        fail("a FHIR or OMOP source needs --at YYYY-MM-DD (ages are computed at it, never at 'today')")


def record_request(records: RecordSource, trial: str | None, trial_ids: list[str] | None) -> dict:
    """The body for a FHIR or OMOP source: the trial (or trials) and the source, no patient yet."""
    body = {"trial_id": trial} if trial is not None else ({"trial_ids": list(trial_ids)} if trial_ids else {})
    body["source"] = screen_source(records.kind, records.label)
    return body


def notes_request(patient_id: str, note: list[Path] | None, trial_ids: list[str] | None) -> dict:
    """The body for one patient from --note files, against the site's trials (or --trial-id ones)."""
    if not note:
        fail("--patient-id needs at least one --note FILE")
    body: dict = {"patient": note_patient(patient_id, note), "source": screen_source("text")}
    if trial_ids:
        body["trial_ids"] = list(trial_ids)
    return body


def patients_file_request(trial: str, patients: Path | None) -> dict:
    """The body for one trial against a patients JSONL."""
    if patients is None:
        fail("--trial needs --patients FILE")
    return {
        "trial_id": trial,
        "patients": patients_file(patients),
        "source": screen_source("patients_file", patients.name),
    }


def api_key(key_env: str) -> str:
    """The API key from its environment variable (never the command line: the shell history)."""
    key = os.environ.get(key_env)
    if not key:
        fail(
            f"${key_env} is not set: put a key with the match role there "
            "(`verdict serve keys add --role match`)"
        )
    return key


def checked_target(url: str) -> str:
    """The service's screen endpoint, once its host passes the egress allowlist (before any connection)."""
    from verdict.data_gen.formalizer import EgressPolicy, EgressRefused

    target = url.rstrip("/") + "/v1/screen"
    try:
        EgressPolicy.from_config().check(target, carries_patient_text=True, what="verdict screen")
    except EgressRefused as e:
        fail(e.summary)
    return target


def add_record_patients(body: dict, found: list[dict], trial: str | None) -> None:
    """A record source's patients into the body: all of them against --trial, else its one patient."""
    if trial is not None:
        body["patients"] = found
    elif len(found) != 1:
        fail(
            f"the source holds {len(found)} patients: pick one with --fhir-patient ID or "
            "--omop-person-ids FILE, or screen a trial against them all with --trial"
        )
    else:
        body["patient"] = found[0]


def post_screen(url: str, target: str, body: dict, key: str, timeout: float) -> dict:
    """POST the screen and return its response; no answer or an error status stops the command."""
    import httpx  # heavy optional dependency: httpx (serve extra)

    try:
        r = httpx.post(target, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    except httpx.HTTPError as e:
        fail(f"the service at {url} did not answer: {type(e).__name__}")
    if r.status_code != 200:
        try:
            err = r.json()
        except ValueError:
            fail(f"HTTP {r.status_code} from {url}")
        problems = "; ".join(f"{p['field']}: {p['message']}" for p in err.get("problems", []))
        fail(f"HTTP {r.status_code}: {err.get('message', '')}" + (f" ({problems})" if problems else ""))
    return r.json()


def report(result: dict, url: str, out: Path | None, research_subjects: Path | None) -> None:
    """Write the response (--out) and its ResearchSubjects (--research-subjects); print the table."""
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
    if research_subjects is not None:
        from .research_subjects import research_subjects_ndjson

        research_subjects.write_text(research_subjects_ndjson(result, url))
    typer.echo(table(result))
    typer.echo(
        f"recorded as screening {result['screening_id']} (GET /v1/screenings/ID, role audit)", err=True
    )


def table(body: dict) -> str:
    """The printed table: the ranked rows, the failed pairs, then the count per tier."""
    lines = [f"{'rank':>4}  {'trial':<16} {'patient':<14} {'tier':<20} {'dist':>4}  reason"]
    for r in body["rows"]:
        lines.append(
            f"{r['rank']:>4}  {r['trial_id']:<16} {r['patient_id']:<14} {r['tier']:<20} "
            f"{r['distance']:>4}  {r['reason']}"
        )
        if r["would_be_eligible_if"]:
            lines.append(f"{'':>6}would be eligible if: {'; '.join(r['would_be_eligible_if'])}")
        if r["to_confirm"]:
            lines.append(f"{'':>6}to confirm: {', '.join(r['to_confirm'])}")
    for f in body["failures"]:
        lines.append(
            f"{'-':>4}  {f['trial_id']:<16} {f['patient_id']:<14} {'failed ' + str(f['status']):<20} "
            f"{'':>4}  {f['error']['message']}"
        )
    lines.append(
        f"{body['pairs']} pairs: "
        + ", ".join(f"{k} {v}" for k, v in sorted(body["tiers"].items()))
        + (f", failed {len(body['failures'])}" if body["failures"] else "")
    )
    return "\n".join(lines)


def write_cohorts(url: str, result: dict, key: str, timeout: float, cfg: OmopConfig, at: str) -> None:
    """--omop-write-cohorts: the run's eligible pairs into the OMOP results schema's cohort table."""
    from verdict.data_gen.fhir.cli import reference_date

    from .omop_cohorts import write_omop_cohorts

    typer.echo(write_omop_cohorts(url, result, key, timeout, cfg, reference_date(at)), err=True)


def write_research_subjects(
    url: str, result: dict, key: str, timeout: float, fhir_server: str, rest: FhirRestConfig | None
) -> None:
    """--write-back: the run's ResearchSubjects onto the FHIR server the patients came from."""
    from .write_back import fetch_subjects, write_subjects

    done = write_subjects(fhir_server, fetch_subjects(url, result["screening_id"], key, timeout), rest)
    typer.echo(
        f"wrote ResearchSubjects to {server_label(fhir_server)}: {done.created} created, "
        f"{done.updated} updated",
        err=True,
    )
