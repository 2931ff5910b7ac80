"""Re-derivations that read the chart again (issue 23): an exhaustive read of chosen atoms, and
completing the mining of a decision that staged mining left with atoms "not asked".

    reading = ChartReading(services)
    record = reading.chart(row, given)                    # the decision's chart (hash checked)
    mined = await reading.mine(program, record, atoms, whole=True)
    patient, conflicts = rederived(program, stored, row, policy, [mined], overrides)
    atoms = await reading.unsettled(program, patient)     # atoms not asked that can change it

- The chart is the audit store's copy when it keeps one (`store_notes: true`), else the record the
  request carries; either way its content hash must be the decision's `note_hash` (409
  `chart_mismatch` otherwise): a different chart is never read silently.
- `whole=True` mines those atoms against every document of the chart as it was sent (no fact sheet,
  no routing, no de-duplication): what a reviewer asks for when the read-once sheet may have missed
  a fact. `whole=False` mines them as a match does (the fact sheet for a long chart, read once and
  cached), so that completing a staged decision gives what exhaustive mining gives.
- Atoms the record's coded FHIR facts decided are not the chart text's: never re-mined here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from verdict.core.errors import PatientError, VerdictError
from verdict.core.patient import Resolution, ResolvedPatient
from verdict.core.policy import Policy, load_policy, resolve
from verdict.core.program import TrialProgram
from verdict.core.settled import not_asked, settles
from verdict.data_gen.formalizer import (
    MinedValues,
    PairCost,
    PassageConflict,
    PatientDoc,
    StageResult,
    merge_sides,
    mine_values,
    pair_cost,
    side_atoms,
)

from ..audit import DecisionRow
from ..errors import InvalidInput, ServiceError
from ..matching.serving import miner_stages, values_unfit
from ..protocol import PatientInput
from ..services import Services
from ..stored_record import record_hash, stored_chart
from .protocol import RecordedChange
from .rederive import conflict_atoms, previous_of, rederive

SIDES = ("exclusion", "inclusion")  # an atom both sides use is asked once, with the first
COMPLETED_BY_REVIEW = "the review's changes let atoms not asked change the decision: mining completed"


class ChartMismatch(ServiceError):
    """The record sent is not the one the decision was made on (409): nothing is read or stored."""

    status, code = 409, "chart_mismatch"


class ChartNeeded(ServiceError):
    """The audit store keeps no patient text and the request carries none, but reading is needed."""

    status, code = 409, "chart_needed"


@dataclass
class Mined:
    """Atoms mined again: which, how (`whole` chart or as a match mines), the stages' results and
    their merged values."""

    atoms: list[str]
    whole: bool
    results: list[StageResult]
    values: MinedValues
    chart: str  # the text read (what the store's note_free hashes quotes of); never logged

    @property
    def conflicts(self) -> list[PassageConflict]:
        return self.values.conflicts

    def resolutions(self, program: TrialProgram, patient_id: str, policy: Policy) -> dict[str, Resolution]:
        """The atoms' new resolutions under `policy`: observed, imputed (nothing found) or open
        (conflicting or unread), as a match resolves them."""
        values = self.values
        try:
            patient = resolve(
                program,
                patient_id,
                list(values),
                policy,
                held_open=values.held_open(),
                sources=values.sources,
            )
        except PatientError as e:  # the miner's check types values; a second line of defence
            raise values_unfit(e) from None
        by_atom = patient.by_atom()
        return {a: by_atom[a] for a in self.atoms}

    def artifact(self) -> dict:
        """What the decision record keeps of this reading (ids, values, quotes; the store's
        `note_free` hashes the quotes under `store_notes: false`)."""
        return {
            "atoms": self.atoms,
            "chart": "whole" if self.whole else "as matched",
            "model": self.results[0].model if self.results else None,
            "stages": miner_stages(*self.results),
        }


def coded_atoms(row: DecisionRow) -> set[str]:
    """Atoms the record's coded FHIR facts decided (the `fhir` artifact)."""
    fhir = row.artifacts.get("fhir") or {}
    return set(fhir.get("coded_atoms") or {}) if isinstance(fhir, dict) else set()


def policy_reasons(name: str) -> set[str]:
    """Reason texts the named policy writes into notes (its current file; empty if it is gone)."""
    try:
        return {r.reason for r in load_policy(name).rules}
    except VerdictError:
        return set()


def rederived(
    program: TrialProgram,
    stored: ResolvedPatient,
    row: DecisionRow,
    policy: Policy,
    mined: list[Mined],
    overrides: dict[str, Resolution | None] | None = None,
) -> tuple[ResolvedPatient, set[str]]:
    """The stored patient with the atoms read again replaced (`overrides`, a reviewer's, win) and
    the decision's policy applied (`rederive.py`); and the atoms still left open by the parent's
    extraction conflicts (those not read again nor changed)."""
    overrides = overrides or {}
    read = {a for m in mined for a in m.atoms}
    kept = conflict_atoms(row.artifacts) - read - set(overrides)
    new = {c.atom for m in mined for c in m.conflicts} - set(overrides)
    changes: dict[str, Resolution | None] = {}
    for m in mined:
        changes.update(m.resolutions(program, row.patient_id, policy))
    changes.update(overrides)
    patient = rederive(
        program, stored, row.policy_name, policy, conflicts=kept | new, overrides=changes,
        reasons=policy_reasons(row.policy_name),
    )  # fmt: skip
    return patient, kept


class ChartReading:
    def __init__(self, services: Services):
        self.services = services

    def chart(self, row: DecisionRow, given: PatientInput | None) -> tuple[PatientDoc, str]:
        """(the record the decision was made on, where it came from: "store" or "request"). A record
        sent must hash to the decision's `note_hash` and name its patient (409 otherwise); without
        one, the store's copy (422 naming `patient` when the store keeps none)."""
        if given is not None:
            if given.patient_id != row.patient_id:
                raise ChartMismatch(
                    f"the record sent is for patient '{given.patient_id}', the decision is for "
                    f"'{row.patient_id}'",
                    [("patient.patient_id", f"the decision's patient is '{row.patient_id}'")],
                )
            record = PatientDoc(patient_id=given.patient_id, documents=given.documents())
            got = record_hash(given.note, record)
            if got != row.note_hash:
                raise ChartMismatch(
                    f"the record sent is not the chart decision '{row.decision_id}' was made on: its hash "
                    f"is {got}, the decision's {row.note_hash}; nothing was read",
                    [("patient", f"record hash {got}, the decision's {row.note_hash}")],
                )
            return record, "request"
        record = stored_chart(row)
        if record is None:
            raise InvalidInput(
                "the audit store keeps no patient text (store_notes: false): send the patient record "
                "again in `patient`, as /v1/match took it",
                [("patient", "required: the store keeps only the record's hash")],
            )
        return record, "store"

    def stored_chart(self, row: DecisionRow, why: str) -> PatientDoc:
        """The store's copy of the chart, for a re-derivation that carries none (409 naming `why`
        when the store keeps no text)."""
        record = stored_chart(row)
        if record is None:
            raise ChartNeeded(
                f"{why}, and the audit store keeps no patient text (store_notes: false): complete the "
                f"mining first with POST /v1/decisions/{row.decision_id}/rereads "
                '{"complete": true, "patient": ...}; nothing was stored',
                [("decision_id", "its mining must be completed with the patient record")],
            )
        return record

    async def mine(
        self, program: TrialProgram, record: PatientDoc, atoms: list[str], *, whole: bool
    ) -> Mined:
        """The value miner on `atoms` only (each asked on the first side that uses it)."""
        matching = self.services.matching
        fz = matching.miner
        left = set(atoms)
        results: list[StageResult] = []
        out = {s: MinedValues([]) for s in SIDES}
        for side in SIDES:
            use = side_atoms(program, side)
            names = [n for n in use if n in left]
            if not names:
                continue
            left -= set(names)
            skip = set(use) - set(names)
            call = (
                mine_values(fz, program, record, side, skip=skip)
                if whole
                else fz.mine_values(program, record, side, skip=skip)
            )
            res = await matching.stages.run(call, f"miner_{side}", record.text)
            results.append(res)
            out[side] = res.output
        merged = merge_sides(out["inclusion"], out["exclusion"])
        return Mined(list(atoms), whole, results, merged, record.text)

    async def unsettled(self, program: TrialProgram, patient: ResolvedPatient) -> list[str]:
        """The atoms staged mining left unasked, when they can now change the decision (the core no
        longer shows the patient ineligible under every completion of them); else []."""
        unasked = not_asked(patient)
        if not unasked:
            return []
        engine = self.services.engine
        settled = await asyncio.to_thread(settles, program, patient, unasked, engine)
        return [] if settled else unasked


def read_changes(
    mined: list[Mined],
    before: ResolvedPatient,
    after: ResolvedPatient,
    reason: str,
    reviewer: str,
    roles: list[str],
    at: float,
) -> list[RecordedChange]:
    """The lineage's record of the readings (no quotes): an exhaustive read, one `reread` change per
    atom (its new value, where it came from, what it was before); a completion, one `complete`
    change naming the atoms mined and those found in the chart."""
    was, now = before.by_atom(), after.by_atom()
    common = {"reason": reason, "reviewer": reviewer, "roles": roles, "at": at}
    out = []
    for m in mined:
        if not m.whole:
            found = [a for a in m.atoms if a in now and now[a].status == "observed"]
            out.append(RecordedChange(type="complete", details={"atoms": m.atoms, "found": found}, **common))
            continue
        for a in m.atoms:
            r = now.get(a)
            out.append(
                RecordedChange(
                    type="reread",
                    atom=a,
                    value=r.value if r is not None and r.status == "observed" else None,
                    established="chart",
                    previous=previous_of(was.get(a)),
                    details={
                        "status": r.status if r is not None else "unresolved",
                        "document": r.evidence_source if r is not None else None,
                    },
                    **common,
                )
            )
    return out


def cost_of(mined: list[Mined]) -> PairCost | None:
    """What the readings cost the formalizer (None: nothing was read)."""
    results = [r for m in mined for r in m.results]
    return pair_cost(*results) if mined else None
