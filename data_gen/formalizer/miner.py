"""The value-miner stage: a patient record + a side's atoms -> checked values with evidence.

Every call fits the answering model's limits. The side's atoms go in chunks
(`mining_plan.atom_chunks`). The prompt (`prompt_templates`; the request and the check of its answer
in `miner_prompt.py`) says how the model answers:

- sparse (v2, the default): only the atoms the text establishes, an omitted atom is null. A chunk
  is at most `MAX_ATOMS_PER_CALL` atoms whose rendered list fits the prompt budget beside the
  bare prompt and a note reserve (the whole record with its document headers, at most half of
  that room; a longer record is split into passages): the prompt binds, not the completion. A
  completion cut off at the token limit (finish_reason "length") is not repaired: its chunk is
  split in two and asked again (down to one atom), so no atom is dropped.
- dense (v1, kept for the records made with it): a line for every asked atom; at most
  `MAX_ATOMS_PER_DENSE_CALL` atoms, and no more than the completion budget holds at a worst-case
  value line, evidence quote included.

The record is split into passages that fit the prompt budget beside the largest chunk
(`passages.py`: never truncated, never across two documents), and consecutive short passages share a
call, each under its document's header. One call per passage group x chunk
(`mining_plan.plan_miner_calls`, which needs no model: the budget report uses it); each quote is
checked against the passages of its call (verbatim in one of them, which names its document); then
the calls are merged deterministically (`findings.merge_findings`):

- a value found in one passage and null in the others is that value;
- the same value found twice keeps the first evidence (documents, then passages, in order);
- values that cannot both hold (true vs false, different numbers, a number outside a bound,
  disjoint bounds) are a `PassageConflict`: both values with their quotes and documents; the
  atom is null in the merge and stays unresolved (`verdict.core.policy.resolve(held_open=...)`).

A call that fails validation after its repair leaves its atoms unresolved (`MinedValues.unread`)
and the other calls' values stand; a side is rejected only when every call failed, each named by its
document, passage and chunk. The accepted calls stay in `StageResult.calls` (and in the cache).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from verdict.core.program import TrialProgram

from .cache import CachedCall
from .checks import Check, compact, core_schema, with_atom_enum
from .findings import Finding, MinedValues, findings_of, merge_findings
from .miner_prompt import check_miner_output, check_side, miner_messages, miner_target, side_atoms
from .mining_plan import MinerBudgetError, PlannedCall, as_documents, note_text, plan_for
from .protocol import NoteDocument, PatientDoc, StageResult, Usage
from .value_reuse import SharedMining, ValueReuse, record_key

if TYPE_CHECKING:
    from .routing import SheetRoute
    from .runtime import Runtime

MINER_BUDGET = "budget"  # the rejection reason of a pass that cannot be asked within the model's limits


async def mine_values(
    fz: Runtime,
    program: TrialProgram,
    note: PatientDoc | NoteDocument | str | list,
    side: str,
    *,
    data_class: str | None = None,
    skip: Collection[str] = (),
    route: SheetRoute | None = None,
) -> StageResult:
    """Patient record + the side's atoms -> checked, merged values with evidence: one call per
    passage x atom chunk (`plan_for`). `output` is a `MinedValues`; `calls` each call's result.
    `skip`: atoms decided without the miner (coded FHIR facts): never asked, never in `output`.
    `route`: the record is a fact sheet, routed to each chunk when it is large (`routing.SheetRoute`)."""
    check_side(side)
    mining = SideMining.of(fz, program, note, side, data_class, route)
    names = [n for n in side_atoms(program, side) if n not in skip]
    if not names:
        return mining.nothing_asked()
    if fz.value_reuse is None:
        gathered = Gathered(rounds=[await mining.round(names)])
    else:  # values of this record another trial already mined (or is mining) are reused
        gathered = await mining.round_sharing(names, fz.value_reuse)
    rejected = next((r.rejected for r in gathered.rounds if r.rejected is not None), None)
    if rejected is not None:
        return rejected
    return mining.accepted(names, gathered)


@dataclass
class MiningRound:
    """What one round of a side's mining made: calls, results, findings per atom, or the rejection."""

    plan: list[PlannedCall] = field(default_factory=list)
    results: list[StageResult] = field(default_factory=list)
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    rejected: StageResult | None = None
    unread: dict[str, str] = field(default_factory=dict)  # atoms of calls that failed validation
    cut: list[StageResult] = field(default_factory=list)  # sparse answers cut off, re-asked in halves


@dataclass
class Gathered:
    """A side's rounds, and the findings other trials' minings gave it (`reused` atoms)."""

    rounds: list[MiningRound] = field(default_factory=list)
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    reused: int = 0


class CallAnswer(NamedTuple):
    """One call's checked result; `cut_off`: a sparse answer cut at the token limit, asked again in
    halves (its cost counts, its result is not an answer)."""

    call: PlannedCall
    result: StageResult
    cut_off: bool


@dataclass
class SideMining:
    """One side's mining of one patient record: what its calls share, and the steps of
    `mine_values` (a round over some atoms, one call with its check, the merge)."""

    fz: Runtime
    program: TrialProgram
    side: str
    docs: list[NoteDocument]
    patient_id: str  # "-" for a bare note: the log names ids only
    data_class: str
    route: SheetRoute | None
    sparse: bool
    by_id: dict[str, NoteDocument] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {d.id: d for d in self.docs}

    @classmethod
    def of(
        cls,
        fz: Runtime,
        program: TrialProgram,
        note: PatientDoc | NoteDocument | str | list,
        side: str,
        data_class: str | None,
        route: SheetRoute | None,
    ) -> SideMining:
        """The mining of this record: its documents, the patient id the log names, its data class."""
        record = note if isinstance(note, PatientDoc) else None
        return cls(
            fz,
            program,
            side,
            as_documents(note),
            record.patient_id if record else "-",
            data_class or (record.data_class if record else "private"),
            route,
            fz.prompt(f"miner_{side}").sparse,
        )

    @property
    def stage(self) -> str:
        return f"miner_{self.side}"

    def result(self, **fields) -> StageResult:
        """A result of this side's stage, naming the endpoint, its model and the prompt."""
        endpoint = self.fz.endpoint
        prompt = self.fz.prompt(self.stage).ident
        return StageResult(
            stage=self.stage, teacher=endpoint.name, model=endpoint.model, prompt_version=prompt, **fields
        )

    def messages(self, note: str, names: list[str]) -> list[dict[str, str]]:
        """The request of one call over this note text, for these atoms."""
        return miner_messages(self.program, note, self.side, names, self.fz.prompts.get(self.stage))

    def nothing_asked(self) -> StageResult:
        """No atom to ask: no call, an empty (trivially valid) answer."""
        return self.result(
            status="accepted",
            messages=self.messages(self.docs[0].text, []),
            output_json=compact({"values": []}),
            output=MinedValues([]),
        )

    async def round_sharing(self, names: list[str], reuse: ValueReuse) -> Gathered:
        """Mining with what other trials found or are finding in this record (`value_reuse.py`):
        only the atoms no trial asked are asked here, and again those whose shared mining failed."""
        key = record_key(self.docs, self.stage, self.fz.prompt(self.stage).ident, self.fz.endpoint.model)
        table = self.program.atom_table()
        found, waiting, claimed = reuse.claim(key, [table[n] for n in names])
        gathered = Gathered(findings=dict(found), reused=len(found))
        if claimed:
            shared = reuse.start(key, claimed, self.round([a.name for a in claimed]))
            gathered.rounds.append(await shared.join())
        again = await take_shared(gathered, waiting)
        if again and not (gathered.rounds and gathered.rounds[-1].rejected is not None):
            gathered.rounds.append(await self.round([n for n in names if n in again]))
        return gathered

    async def round(self, names: list[str]) -> MiningRound:
        """One round over these atoms: plan the calls, ask each, keep the findings (or the rejection)."""
        if not names:
            return MiningRound()
        try:  # exact token counts: off the loop
            plan = await asyncio.to_thread(
                plan_for, self.fz, self.program, self.docs, self.side, names, self.route
            )
        except MinerBudgetError as e:  # no call can fit the model's limits: rejected, no call made
            return MiningRound(rejected=self.over_budget(names, e))
        answers = [a for out in await asyncio.gather(*(self.answers(c) for c in plan)) for a in out]
        cut = [a.result for a in answers if a.cut_off]  # re-asked in halves: cost, not a failure
        kept = [a for a in answers if not a.cut_off]
        # Nothing read: the side is rejected (502 in the service). No call at all (a routed sheet
        # with nothing that bears on these atoms) is no finding, not a failure: the atoms stay null.
        if kept and not any(a.result.accepted for a in kept):
            return self.all_rejected(kept, cut)
        return findings_round(kept, cut)

    def over_budget(self, names: list[str], error: MinerBudgetError) -> StageResult:
        """The side rejected before any call: no call of it fits the model's limits."""
        return self.result(
            status="rejected",
            reason=MINER_BUDGET,
            problems=[error.summary],
            messages=self.messages(self.docs[0].text, names),
        )

    async def answers(self, call: PlannedCall) -> list[CallAnswer]:
        """A call's answers: its own and, when a sparse answer was cut off at the token limit, its
        two halves' answers, asked again (an atom is never dropped)."""
        result = await self.ask(call)
        if not (self.splittable(call) and result.reason == "truncated"):
            return [CallAnswer(call, result, cut_off=False)]
        halves = await asyncio.to_thread(self.halves, call)
        asked = await asyncio.gather(*(self.answers(h) for h in halves))
        return [CallAnswer(call, result, cut_off=True), *(a for part in asked for a in part)]

    def splittable(self, call: PlannedCall) -> bool:
        """A sparse answer for several atoms that is cut off is split in two, not repaired."""
        return self.sparse and len(call.atoms) > 1

    def halves(self, call: PlannedCall) -> list[PlannedCall]:
        """The call's atoms in two calls over the same passages."""
        text = note_text(call.passages, self.by_id)
        return call.halves(partial(self.messages, text), self.fz.tokens.count_messages)

    async def ask(self, call: PlannedCall) -> StageResult:
        """One call through the runtime with its check (`check`), named by its call id."""
        result = await self.fz.run_stage(
            self.stage,
            call.messages,
            with_atom_enum(core_schema("value-miner"), call.atoms),
            "value_miner_output",
            partial(self.check, call),
            patient_text=True,
            data_class=self.data_class,
            sensitive=tuple(call.texts),
            ids=f"trial={self.program.trial_id} patient={self.patient_id} call={call.call_id}",
            no_repair=("truncated",) if self.splittable(call) else (),
        )
        return result.model_copy(update={"item": call.call_id})

    def check(self, call: PlannedCall, answer: CachedCall) -> Check:
        """One answer checked against its call: the call's atoms, quotes verbatim in its passages."""
        return check_miner_output(
            answer.content,
            answer.finish_reason,
            self.program,
            call.atoms,
            call.texts,
            max_tokens=self.fz.endpoint.max_tokens.for_stage(self.stage),
            sparse=self.sparse,
        )

    def all_rejected(self, kept: list[CallAnswer], cut: list[StageResult]) -> MiningRound:
        """A round whose every call failed validation: the side's rejection, naming each call."""
        plan = [a.call for a in kept]
        results = [a.result for a in kept]
        rejected = self.result(
            status="rejected",
            reason=results[0].reason,
            problems=[f"{a.call.label}: {p}" for a in kept for p in a.result.problems],
            messages=results[0].messages,
            attempts=[x for r in results for x in r.attempts],
            usage=Usage.total(r.usage for r in results + cut),
            calls=results,
            assembly=_assembly(plan, None),
        )
        return MiningRound(plan, results, cut=cut, rejected=rejected)

    def accepted(self, names: list[str], gathered: Gathered) -> StageResult:
        """The side's answer: the reused findings and every round's merged into one value per atom;
        the atoms of calls that failed validation stay unresolved, each with the reason."""
        rounds = gathered.rounds
        findings = dict(gathered.findings)
        unread: dict[str, str] = {}
        for r in rounds:
            findings.update(r.findings)
            unread.update(r.unread)
        plan = [c for r in rounds for c in r.plan]
        results = [x for r in rounds for x in r.results]
        cut = [x for r in rounds for x in r.cut]
        merged = merge_findings(names, findings, self.side)
        merged.unread = {a: why for a, why in unread.items() if a not in findings}
        return self.result(
            status="accepted",
            messages=results[0].messages if results else self.messages(self.docs[0].text, names),
            output_json=miner_target(merged.values, sparse=self.sparse),
            output=merged,
            attempts=[a for r in cut + results for a in r.attempts],
            usage=Usage.total(r.usage for r in results + cut),
            calls=results,
            assembly={
                **_assembly(plan, merged),
                "reused_atoms": gathered.reused,
                "cut_off": [r.item for r in cut],
            },
        )


async def take_shared(gathered: Gathered, waiting: dict[str, SharedMining]) -> list[str]:
    """Into `gathered`, the findings of the other trials' minings these atoms wait for; returns the
    atoms this trial must ask itself (that mining failed, or its call for the atom did)."""
    again: list[str] = []
    for shared in {id(s): s for s in waiting.values()}.values():
        mine = [n for n, s in waiting.items() if s is shared]
        other = await joined(shared)
        if other is None or other.rejected is not None:
            again += mine
            continue
        again += [n for n in mine if n in other.unread]
        taken = [n for n in mine if n not in other.unread]
        gathered.findings.update({n: other.findings.get(n, []) for n in taken})
        gathered.reused += len(taken)
    return again


async def joined(shared: SharedMining) -> MiningRound | None:
    """Another trial's mining of atoms this trial needs, or None when it failed."""
    try:
        return await shared.join()
    except Exception:  # noqa: BLE001 - another trial's failure is not this trial's: it asks again
        return None


def findings_round(kept: list[CallAnswer], cut: list[StageResult]) -> MiningRound:
    """A round's findings per atom: a call that failed validation (after its repair) does not throw
    the others away; its atoms stay unresolved, each with the reason (ids only)."""
    found: dict[str, list[Finding]] = {}
    unread: dict[str, str] = {}
    for call, result, _ in kept:
        if not result.accepted:
            for atom in call.atoms:
                unread.setdefault(
                    atom,
                    f"not read: the value miner's answer for {call.label} failed validation "
                    f"after one repair ({result.reason})",
                )
            continue
        for atom, fs in findings_of(result.output, call).items():
            found.setdefault(atom, []).extend(fs)
    return MiningRound(
        [a.call for a in kept],
        [a.result for a in kept],
        findings={a: f for a, f in found.items() if a not in unread},
        unread=unread,
        cut=cut,
    )


def _assembly(plan: list[PlannedCall], merged: MinedValues | None) -> dict:
    """What the merge did, in ids only (no patient text): calls, passages per document, conflicts."""
    docs: dict[str, int] = {}
    for c in plan:
        for p in c.passages:
            docs[p.document] = p.total
    out = {"calls": len(plan), "chunks": plan[0].chunks if plan else 0, "passages": docs}
    if merged is not None:
        out["conflicts"] = [c.atom for c in merged.conflicts]
        out["unread"] = sorted(merged.unread)
    return out
