"""Screening order by formal distance: which trials (or patients) come first, from the decision's
own accountability artifacts, never from a score a model makes up (issue: site-wide screening).

    rows = rank(decisions)          # best first; each row says why it is where it is
    rows = rerank(a_rows + b_rows)  # rows ranked apart (a screen's pairs as they finish), one order

Tiers, best first:
  1. eligible, nothing to confirm;
  2. eligible with k assumptions to confirm (the non-inert ones of ρ, as the rationale lists them),
     fewer first;
  3. ineligible with |δ_E| = 1 ("would be eligible if ..."), then 2, ...; a δ_E the solver limit cut
     short counts as found but ranks after complete ones of the same size;
  4. ineligible with no way to eligibility known (no δ_E, or none found);
  5. undetermined (an extraction conflict or a solver limit left the decision open).
Ties are broken by trial id, then patient id: the order is a pure function of the decisions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from .decision import Decision
from .settled import RESTS_ON_UNASKED

Tier = Literal["eligible", "eligible_to_confirm", "near_miss", "ineligible", "undetermined"]
_TIER_ORDER = {"eligible": 0, "eligible_to_confirm": 1, "near_miss": 2, "ineligible": 3, "undetermined": 4}


R = TypeVar("R", bound="RankedRow")


class RankedRow(BaseModel):
    """One screened pair in the order, with what put it there."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(description="1 = best")
    trial_id: str
    patient_id: str
    decision: Literal["eligible", "ineligible", "undetermined"]
    tier: Tier = Field(description="eligible | eligible_to_confirm | near_miss | ineligible | undetermined")
    distance: int = Field(description="assumptions to confirm (eligible) or |δ_E| (near miss); 0 otherwise")
    to_confirm: list[str] = Field(default_factory=list, description="atoms to confirm at the screening visit")
    would_be_eligible_if: list[str] = Field(
        default_factory=list, description="δ_E conditions, as 'atom: current -> target' (near misses)"
    )
    complete: bool = Field(True, description="false when a solver limit cut the pivotal search short")
    rests_on_unasked: bool = Field(
        False,
        description="the decision was settled before every atom was asked (staged mining): its δ_E "
        "takes the unasked atoms as free and may understate the change needed",
    )
    reason: str = Field(description="one line: why this row is where it is")


def to_confirm(d: Decision) -> list[str]:
    """The assumptions a coordinator confirms at the visit: every non-inert one (as the rationale)."""
    return [a.atom for a in d.assumptions if a.cls != "inert"]


def _condition(c) -> str:
    return f"{c.atom}: {'open' if c.current is None else c.current} -> {c.target}"


def placement(d: Decision) -> tuple[Tier, int, list[str], list[str], bool]:
    """(tier, distance, to confirm, δ_E conditions, complete) of one decision."""
    if d.decision == "eligible":
        confirm = to_confirm(d)
        return ("eligible_to_confirm" if confirm else "eligible"), len(confirm), confirm, [], True
    if d.decision == "ineligible":
        p = d.pivotal
        if p is not None and p.direction == "to_eligible" and p.conditions:
            return "near_miss", len(p.conditions), [], [_condition(c) for c in p.conditions], p.complete
        return "ineligible", 0, [], [], p.complete if p is not None else True
    return "undetermined", 0, [], [], True


def _reason(tier: Tier, distance: int, d: Decision) -> str:
    if tier == "eligible":
        return "eligible, nothing to confirm"
    if tier == "eligible_to_confirm":
        return (
            f"eligible if {distance} assumption{'s' * (distance != 1)} "
            f"{'is' if distance == 1 else 'are'} confirmed"
        )
    if tier == "near_miss":
        return f"ineligible; would be eligible if {distance} condition{'s' * (distance != 1)} changed"
    if tier == "ineligible":
        return "ineligible; no change of the open or recorded facts makes it eligible"
    return f"undetermined: {d.reason or 'the decision is open'}"


def rests_on_unasked(d: Decision) -> bool:
    """Whether the decision's δ_E rests on atoms staged mining left unasked (`verdict.core.settled`)."""
    return d.pivotal is not None and RESTS_ON_UNASKED in (d.pivotal.note or "")


def _key(tier: Tier, distance: int, complete: bool, trial_id: str, patient_id: str) -> tuple:
    return (_TIER_ORDER[tier], distance, not complete, trial_id, patient_id)


def rerank(rows: Iterable[R]) -> list[R]:
    """Rows ranked apart (each from `rank`), in the one order `rank` gives them all: sorted by the
    same key and numbered again. Lets a caller keep a small row per decision, not the decision."""
    ordered = sorted(rows, key=lambda r: _key(r.tier, r.distance, r.complete, r.trial_id, r.patient_id))
    return [r.model_copy(update={"rank": i + 1}) for i, r in enumerate(ordered)]


def rank(decisions: list[Decision]) -> list[RankedRow]:
    """The decisions in screening order (see the module docstring), best first."""
    keyed = []
    for d in decisions:
        tier, distance, confirm, flips, complete = placement(d)
        key = _key(tier, distance, complete, d.trial_id, d.patient_id)
        keyed.append((key, d, tier, distance, confirm, flips, complete))
    keyed.sort(key=lambda k: k[0])
    return [
        RankedRow(
            rank=i + 1,
            trial_id=d.trial_id,
            patient_id=d.patient_id,
            decision=d.decision,
            tier=tier,
            distance=distance,
            to_confirm=confirm,
            would_be_eligible_if=flips,
            complete=complete,
            rests_on_unasked=rests_on_unasked(d),
            reason=_reason(tier, distance, d)
            + ("; δ_E rests on atoms not asked" if rests_on_unasked(d) else ""),
        )
        for i, (_, d, tier, distance, confirm, flips, complete) in enumerate(keyed)
    ]
