"""What the value-miner calls found, merged deterministically: one value per atom from every
passage's findings, and conflicts where two values cannot both hold (see `miner.py`); also the two
sides' merges as one (`merge_sides`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field
from verdict.core.configs import StrictModel
from verdict.core.patient import Bounds, MinedValue, Value
from verdict.core.reference import meet as meet_values  # the one rule for two records of one fact

from .protocol import SINGLE_NOTE_ID

if TYPE_CHECKING:
    from .mining_plan import PlannedCall


class Finding(StrictModel):
    """One value as one call found it."""

    value: Value | None = None
    bounds: Bounds | None = None
    evidence: str
    document: str = Field(description="id of the document the evidence quotes")
    passage: str = Field(description="the call that found it: DOC#PASSAGE/cCHUNK")

    def shown(self, atom: str) -> str:
        """The value as a rationale states it: `atom >= 5` for bounds, else the JSON value."""
        return self.bounds.text(atom) if self.bounds is not None else json.dumps(self.value)


class PassageConflict(StrictModel):
    """Values for one atom that cannot both hold: the atom is left unresolved."""

    atom: str
    side: str = Field(description="inclusion, exclusion, or 'both' (the two sides' merges disagree)")
    findings: list[Finding] = Field(min_length=2, description="each distinct value with its first quote")

    def note(self) -> str:
        """The unresolved atom's note: values and documents, never the quotes."""
        said = "; ".join(f"document '{f.document}' gives {f.shown(self.atom)}" for f in self.findings)
        return f"extraction conflict, confirm in the chart: {said}"


@dataclass
class MinedValues:
    """A side's merged values (one per asked atom, prompt order; iterating yields them), the
    document each value's evidence comes from, and the conflicts between passages."""

    values: list[MinedValue]
    sources: dict[str, str] = field(default_factory=dict)
    conflicts: list[PassageConflict] = field(default_factory=list)
    unread: dict[str, str] = field(default_factory=dict)  # atom -> why no call could read it

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def held_open(self) -> dict[str, str]:
        """atom -> note, for `verdict.core.policy.resolve(held_open=...)`: the atoms that stay
        unresolved whatever the policy says (values that contradict, and atoms a call that failed
        validation asked: the chart may hold them, so a default must not stand in for them)."""
        return {**self.unread, **{c.atom: c.note() for c in self.conflicts}}


def _compatible(a: Finding, b: Finding) -> Finding | None:
    """What both findings say, or None if they cannot both hold: the import's rule for two records of
    one chart fact (`verdict.core.reference`), keeping the document of the quote that stays."""
    mv_a = MinedValue(atom="x", value=a.value, bounds=a.bounds, evidence=a.evidence)
    mv_b = MinedValue(atom="x", value=b.value, bounds=b.bounds, evidence=b.evidence)
    met = meet_values(mv_a, mv_b)
    if met is None:
        return None
    keep = b if met is mv_b else a
    return keep.model_copy(update={"value": met.value, "bounds": met.bounds})


def merge_findings(names: list[str], findings: dict[str, list[Finding]], side: str) -> MinedValues:
    """One value per atom from the calls' findings (each atom's list in plan order)."""
    values, sources, conflicts = [], {}, []
    for name in names:
        found = findings.get(name, [])
        if not found:
            values.append(MinedValue(atom=name, value=None))
            continue
        kept, distinct, clash = found[0], [found[0]], False
        for f in found[1:]:
            if not any((f.value, f.bounds) == (d.value, d.bounds) for d in distinct):
                distinct.append(f)
            merged = None if clash else _compatible(kept, f)
            if merged is None:
                clash = True
            else:
                kept = merged
        if clash:
            conflicts.append(PassageConflict(atom=name, side=side, findings=distinct))
            values.append(MinedValue(atom=name, value=None))
        else:
            values.append(MinedValue(atom=name, value=kept.value, bounds=kept.bounds, evidence=kept.evidence))
            sources[name] = kept.document
    return MinedValues(values, sources, conflicts)


def findings_of(values: list[MinedValue], call: PlannedCall) -> dict[str, list[Finding]]:
    """A call's non-null values, each with the document its quote is from."""
    return {
        mv.atom: [
            Finding(
                value=mv.value,
                bounds=mv.bounds,
                evidence=mv.evidence,
                document=call.source_of(mv.evidence),
                passage=call.call_id,
            )
        ]
        for mv in values
        if mv.value is not None or mv.bounds is not None
    }


def merge_sides(inclusion: MinedValues, exclusion: MinedValues) -> MinedValues:
    """The two sides' merges as one (an atom both sides use: the same rule as between passages):
    what `resolve` takes, with every conflict of either side."""
    findings: dict[str, list[Finding]] = {}
    names: list[str] = []
    for mv_side in (inclusion, exclusion):
        for mv in mv_side.values:
            if mv.atom not in names:
                names.append(mv.atom)
            if mv.value is not None or mv.bounds is not None:
                doc = mv_side.sources.get(mv.atom, SINGLE_NOTE_ID)
                findings.setdefault(mv.atom, []).append(
                    Finding(value=mv.value, bounds=mv.bounds, evidence=mv.evidence, document=doc, passage=doc)
                )
    merged = merge_findings(names, findings, "both")
    conflicts = inclusion.conflicts + exclusion.conflicts
    taken = {c.atom for c in conflicts}
    conflicts += [c for c in merged.conflicts if c.atom not in taken]
    unread = {a: why for a, why in {**inclusion.unread, **exclusion.unread}.items() if a not in taken}
    taken |= set(unread)  # an atom one side's failed call asked stays unresolved for both
    values = [MinedValue(atom=mv.atom, value=None) if mv.atom in taken else mv for mv in merged.values]
    sources = {a: d for a, d in merged.sources.items() if a not in taken}
    return MinedValues(values, sources, conflicts, unread)
