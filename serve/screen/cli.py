"""`verdict screen`: ask the site's running matching service for a ranked screen (POST /v1/screen).

    verdict screen --url http://127.0.0.1:8000 --patient-id P1 --note discharge.txt --note labs.txt
    verdict screen --url ... --trial NCT00000001 --patients population.jsonl      # one trial, many patients

The key is read from an environment variable (default VERDICT_API_KEY), never from the command
line (it would land in the shell history). Patient text goes to the service only if its host
passes the egress allowlist (loopback or `VERDICT_EGRESS_ALLOW`), checked before any connection.
Prints the ranked table; `--out FILE` also writes the whole response as JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from verdict_core.cli_errors import fail

KEY_ENV = "VERDICT_API_KEY"


def _patients(path: Path) -> list[dict]:
    """The patients JSONL through the project's one patient reader (`data_gen.sources`), as the
    batch sends them (`patient_input`); each bad line is reported by number, never by content."""
    from data_gen.sources import load_patients

    from ..match_batch import patient_input

    loaded = load_patients(path)
    for problem in loaded.problems:
        typer.echo(f"skipped: {problem}", err=True)
    if not loaded.items:
        fail(f"{path.name}: no patients")
    return [patient_input(p).model_dump(exclude_none=True) for p in loaded.items]


def table(body: dict) -> str:
    lines = [f"{'rank':>4}  {'trial':<16} {'patient':<14} {'tier':<20} {'dist':>4}  reason"]
    for r in body["rows"]:
        lines.append(f"{r['rank']:>4}  {r['trial_id']:<16} {r['patient_id']:<14} {r['tier']:<20} "
                     f"{r['distance']:>4}  {r['reason']}")
        if r["would_be_eligible_if"]:
            lines.append(f"{'':>6}would be eligible if: {'; '.join(r['would_be_eligible_if'])}")
        if r["to_confirm"]:
            lines.append(f"{'':>6}to confirm: {', '.join(r['to_confirm'])}")
    for f in body["failures"]:
        lines.append(f"{'-':>4}  {f['trial_id']:<16} {f['patient_id']:<14} {'failed ' + str(f['status']):<20} "
                     f"{'':>4}  {f['error']['message']}")
    lines.append(f"{body['pairs']} pairs: " + ", ".join(f"{k} {v}" for k, v in sorted(body["tiers"].items()))
                 + (f", failed {len(body['failures'])}" if body["failures"] else ""))
    return "\n".join(lines)


def screen(
    url: str = typer.Option(..., help="the matching service, e.g. http://127.0.0.1:8000"),
    patient_id: Optional[str] = typer.Option(None, help="screen this patient against the registered trials"),
    note: Optional[list[Path]] = typer.Option(None, exists=True, dir_okay=False,
                                             help="a document of the patient (repeat for several)"),
    trial_ids: Optional[list[str]] = typer.Option(None, "--trial-id", help="only these trials (repeat)"),
    trial: Optional[str] = typer.Option(None, help="screen this trial against --patients"),
    patients: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, help="patients JSONL, with --trial"),
    policy: Optional[str] = typer.Option(None, help="policy name (default: the service's)"),
    key_env: str = typer.Option(KEY_ENV, help="environment variable holding the API key (role match)"),
    out: Optional[Path] = typer.Option(None, help="also write the whole response here (JSON)"),
    timeout: float = typer.Option(3600, help="seconds to wait for the screen"),
) -> None:
    """One patient against the site's trials, or one trial against patients, ranked by formal
    distance (eligible; eligible with k to confirm; ineligible with |δ_E| = 1, 2, ...)."""
    import httpx

    from data_gen.egress import EgressPolicy
    from data_gen.errors import EgressRefused

    if (patient_id is None) == (trial is None):
        fail("give --patient-id with --note, or --trial with --patients")
    if patient_id is not None:
        if not note:
            fail("--patient-id needs at least one --note FILE")
        docs = [{"id": p.name, "text": p.read_text()} for p in note]
        body: dict = {"patient": {"patient_id": patient_id, "notes": docs}}
        if trial_ids:
            body["trial_ids"] = list(trial_ids)
    else:
        if patients is None:
            fail("--trial needs --patients FILE")
        body = {"trial_id": trial, "patients": _patients(patients)}
    if policy:
        body["policy"] = policy
    key = os.environ.get(key_env)
    if not key:
        fail(f"${key_env} is not set: put a key with the match role there (`verdict serve keys add --role match`)")
    target = url.rstrip("/") + "/v1/screen"
    try:
        EgressPolicy.from_config().check(target, carries_patient_text=True, what="verdict screen")
    except EgressRefused as e:
        fail(e.summary)
    try:
        r = httpx.post(target, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    except httpx.HTTPError as e:
        fail(f"the service at {url} did not answer: {type(e).__name__}")
    if r.status_code != 200:
        try:
            err = r.json()
            problems = "; ".join(f"{p['field']}: {p['message']}" for p in err.get("problems", []))
            fail(f"HTTP {r.status_code}: {err.get('message', '')}" + (f" ({problems})" if problems else ""))
        except ValueError:
            fail(f"HTTP {r.status_code} from {url}")
    result = r.json()
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
    typer.echo(table(result))
