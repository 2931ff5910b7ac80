"""Reviews become site training data: `verdict teacher export --from-reviews AUDIT_DB`.

From the audit store of a running service (serve/audit, schema 3):

- a reviewed decision (lineage kind `review`: `correct` / `confirm` changes) becomes value-miner
  records. For the newest decision of each lineage, the value miner's stored output is overlaid with
  every change of the chain (oldest first); the note is planned into calls exactly as the service
  plans them (`serve/students.py` `miner_rows`: atom chunks x passages under the service's limits), and
  each call that asks a changed atom is one record: the passage(s) + the side's atoms -> the values
  with the reviewer's value, the reviewer's evidence quote as evidence. Each passes
  `check_miner_output`, as any teacher record must.
- a trial revision (origin `revision`) becomes per-criterion parser records of the criteria it
  changed (`criterion_outputs` of the revision vs the version it revises; the `criterion_parser`
  prompt), checked with `check_criterion_output`.

What cannot become a record is counted by reason, with its decision (or trial version) ids, never
dropped silently: `no_note` (the store keeps note text only with `store_notes` on), `evidence_not_in_note`
(a value whose reviewer evidence is not a verbatim quote of the note: a student cannot learn to read
it from the note, and the check refuses a value without evidence, so the call is skipped),
`no_program`, `rejected` (a record that failed its check).

Provenance on every row (`provenance` column, JSON): source, decision ids, reviewer roles, review
times. Never reviewer key ids or names. The rows contain patient text: data class `private`; the
output must be a local folder (a URL is checked against the egress allowlist and refused).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from verdict.core.engine import default_engine
from verdict.core.errors import VerdictError
from verdict.core.program import load_program
from verdict.data_gen.formalizer import (
    CriterionText,
    EgressPolicy,
    StageResult,
    asked_atoms,
    check_criterion_output,
    check_miner_output,
    compact,
    criterion_messages,
    criterion_outputs,
    quote_in_note,
    side_atoms,
    stage_prompt,
)
from verdict.data_gen.records import RecordStore
from verdict.data_gen.sft_record import target

from ..api_config import FormalizerConfig
from ..audit.store import AuditStore
from ..students import miner_rows, teacher_programs

DATA_CLASS = "private"
TEACHER = "site-review"
DATA_RULES = (
    "These records contain patient text (data class private): keep them on the site's own "
    "storage; they never leave the egress allowlist (data_gen/formalizer/egress.py)."
)


@dataclass
class ReviewExportSummary:
    miner_records: int = 0
    parser_records: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> decision / trial version ids

    def skip(self, reason: str, ident: str) -> None:
        ids = self.skipped.setdefault(reason, [])
        if ident not in ids:
            ids.append(ident)

    def as_dict(self) -> dict:
        return {
            "miner_records": self.miner_records,
            "parser_records": self.parser_records,
            "skipped": {k: {"count": len(v), "ids": v} for k, v in sorted(self.skipped.items())},
        }


def check_destination(out: str | Path, egress=None) -> Path:
    """The output folder, or EgressRefused/VerdictError: private records are written to local disk only."""

    text = str(out)
    if "://" in text:
        (egress or EgressPolicy.from_config()).check(
            text, carries_patient_text=True, data_class=DATA_CLASS, what="review export"
        )
        raise VerdictError(
            f"--out must be a local folder (got a URL to '{urlsplit(text).hostname}'): "
            "review records are private and are written to the site's own disk"
        )
    return Path(out)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _chain(audit, row) -> list:
    """The decisions of `row`'s lineage, oldest first."""
    out = [row]
    while out[0].parent_id:
        parent = audit.decision(out[0].parent_id)
        if parent is None:
            break
        out.insert(0, parent)
    return out


def _provenance(reviews: list, changes: list[dict]) -> dict:
    return {
        "source": "review",
        "data_class": DATA_CLASS,
        "decision_ids": [r.decision_id for r in reviews],
        "reviewer_roles": sorted({role for c in changes for role in c.get("roles") or []}),
        "reviewed_at": sorted({_iso(c["at"]) for c in changes if c.get("at") is not None}),
        "changes": [{"type": c["type"], "atom": c.get("atom")} for c in changes],
    }


def miner_results(audit, row, limits, summary: ReviewExportSummary, prompt_version: str = "v1"):
    """[(StageResult, provenance)] for the newest decision `row` of a reviewed lineage."""

    chain = _chain(audit, row)
    reviews = [r for r in chain if (r.lineage or {}).get("kind") == "review"]
    changes = [
        c for r in reviews for c in r.lineage.get("changes", []) if c.get("type") in ("correct", "confirm")
    ]
    if not changes:
        return []
    if row.note_text is None:
        summary.skip("no_note", row.decision_id)
        return []
    trial = audit.trial_version(row.trial_id, row.program_hash)
    if trial is None:
        summary.skip("no_program", row.decision_id)
        return []
    program = load_program(json.loads(trial.program_json))
    note = row.note_text
    facts: dict[str, list] = {}
    for side in ("inclusion", "exclusion"):  # what the value miner answered
        output = ((chain[0].artifacts.get("value_miner") or {}).get(f"miner_{side}") or {}).get(
            "output"
        ) or {}
        got = {v["atom"]: v for v in output.get("values", [])}
        for name in side_atoms(program, side):
            v = got.get(name) or {}
            facts[name] = [v.get("value"), v.get("evidence") or ""]
    unreadable = set()
    for c in changes:  # the reviewers' answers, oldest first
        facts[c["atom"]] = [c.get("value"), c.get("evidence") or ""]
        if c.get("value") is not None and not quote_in_note(c.get("evidence") or "", note):
            unreadable.add(c["atom"])
        else:
            unreadable.discard(c["atom"])
    changed = {c["atom"] for c in changes}
    records = {
        "trials": [
            {
                "trial_id": program.trial_id,
                "title": program.title,
                "parsed": program.model_dump(mode="json", by_alias=True),
            }
        ],
        "patients": [{"patient_id": row.patient_id, "note": note, "facts": facts}],
    }
    programs = teacher_programs(records)
    prov = _provenance(reviews, changes)
    out = []
    for r in miner_rows(records, programs, {"teacher": TEACHER, "prompt_version": prompt_version}, limits):
        answer = target(r)
        atoms = asked_atoms(r["messages"][:-1])  # a sparse target names only the established ones
        if not changed & set(atoms):
            continue  # a call the review did not touch: nothing new to learn
        if unreadable & set(atoms):
            summary.skip("evidence_not_in_note", row.decision_id)
            continue
        user = "\n".join(m["content"] for m in r["messages"][:-1] if m["role"] == "user")
        # the passage(s) of this call: the texts of the note the prompt shows (quote check)
        check = check_miner_output(
            answer, "stop", program, atoms, [note], max_tokens=0, sparse=stage_prompt(r["stage"]).sparse
        )
        if not check.ok or not all(quote_in_note(v.evidence, user) for v in check.output if v.evidence):
            summary.skip("rejected", row.decision_id)
            continue
        out.append(
            (
                StageResult(
                    stage=r["stage"],
                    status="accepted",
                    teacher=TEACHER,
                    model="reviewer",
                    prompt_version=f"{r['stage']}@{prompt_version}",
                    messages=r["messages"][:-1],
                    output_json=check.output_json,
                    item=f"{row.decision_id}/{r['record_id']}",
                ),
                prov,
            )
        )
    return out


def parser_results(audit, trial, summary: ReviewExportSummary, prompt_version: str = "v1"):
    """[(StageResult, provenance)]: the criteria a revision changed, as per-criterion parser records."""

    ident = f"{trial.trial_id}@{trial.program_hash}"
    program = load_program(json.loads(trial.program_json))
    revises = (trial.details or {}).get("revises")
    old = audit.trial_version(trial.trial_id, revises) if revises else None
    before = criterion_outputs(load_program(json.loads(old.program_json))) if old is not None else {}
    after = criterion_outputs(program)
    prov = {
        "source": "revision",
        "data_class": DATA_CLASS,
        "trial_version": trial.program_hash,
        "revises": revises,
        "reviewer_roles": ["trial_owner"] if trial.created_by else [],
        "reviewed_at": [_iso(trial.created_at)],
    }
    old_text = (
        {cr.id: cr.text for _, _, cr in load_program(json.loads(old.program_json)).criteria()} if old else {}
    )
    out = []
    for _, side, cr in program.criteria():
        dump = lambda o: o.model_dump(mode="json", by_alias=True, exclude_defaults=True)  # noqa: E731
        if cr.id in before and old_text.get(cr.id) == cr.text and dump(before[cr.id]) == dump(after[cr.id]):
            continue  # unchanged by the revision
        c = CriterionText(cr.id, side, cr.text)
        check = check_criterion_output(
            compact(dump(after[cr.id])),
            "stop",
            c,
            max_tokens=0,
            check_satisfiable=default_engine().check_satisfiable,
        )
        if not check.ok:
            summary.skip("rejected", ident)
            continue
        out.append(
            (
                StageResult(
                    stage="parser",
                    status="accepted",
                    teacher=TEACHER,
                    model="reviewer",
                    prompt_version=f"criterion_parser@{prompt_version}",
                    messages=criterion_messages(c, prompt_version),
                    output_json=check.output_json,
                    item=f"{trial.program_hash[7:23]}#{cr.id}",
                ),
                prov,
            )
        )
    return out


def export_reviews(
    audit_db: str,
    out: str | Path,
    *,
    limits=None,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    overwrite: bool = False,
    egress=None,
) -> tuple[dict[str, dict], ReviewExportSummary]:
    """Write `<out>/value_miner` and `<out>/parser` from an audit store's reviews (export.py's writer:
    split by trial, dataset card); return (cards, summary)."""
    # heavy optional dependency: datasets (teacher extra)
    from verdict.data_gen.export import export_datasets

    out = check_destination(out, egress)
    limits = limits or FormalizerConfig()  # the service's defaults: plan calls as it does
    if "://" not in str(audit_db) and not Path(audit_db).exists():
        raise VerdictError(f"no audit store at {audit_db}")
    audit = AuditStore(audit_db, read_only=True)
    summary = ReviewExportSummary()
    results = []
    try:
        for trial_id in audit.trial_ids():
            for version in audit.trial_versions(trial_id):
                if version.origin == "revision":
                    results += [(r, p, trial_id, None) for r, p in parser_results(audit, version, summary)]
        for row in audit.current_decisions():
            if row.parent_id is not None:
                results += [
                    (r, p, row.trial_id, row.patient_id)
                    for r, p in miner_results(audit, row, limits, summary)
                ]
    finally:
        audit.close()
    tmp = Path(tempfile.mkdtemp(prefix="review-export-"))
    try:  # the records pass through a run store so that export.py writes them like any run
        run = tmp / "reviews"
        store = RecordStore(run / "records.sqlite")
        provenance = {}
        try:
            for res, prov, trial_id, patient_id in results:
                rid = store.put(res.model_copy(update={"item": None}), trial_id, patient_id, item=res.item)
                provenance[rid] = prov
        finally:
            store.close()
        summary.miner_records = sum(1 for r, *_ in results if r.stage != "parser")
        summary.parser_records = sum(1 for r, *_ in results if r.stage == "parser")
        cards = export_datasets(
            [run],
            out,
            seed=seed,
            fractions=fractions,
            overwrite=overwrite,
            provenance=provenance,
            card_extra={
                "data_class": DATA_CLASS,
                "data_rules": DATA_RULES,
                "source": "reviews",
                "review_export": summary.as_dict(),
            },
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cards, summary
