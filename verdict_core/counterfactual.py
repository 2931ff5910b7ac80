"""CF(x, δ) and PivotalFlipRate (paper Def. 2-3).

CF changes exactly the atoms δ names, each to its representative target (inside the stated
requirement), and leaves every other atom with its status: unresolved atoms stay free. Deciding
CF again must give the other decision; PivotalFlipRate measures that over a set of cases, per
direction, and is 1.0 by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from .decision import PivotalCondition
from .patient import Resolution, ResolvedPatient
from .program import TrialProgram


def apply_pivotal(patient: ResolvedPatient, conditions: list[PivotalCondition]) -> ResolvedPatient:
    change = {c.atom: c for c in conditions}
    out = []
    for r in patient.resolutions:
        c = change.pop(r.atom, None)
        out.append(r if c is None else _cf(c))
    out += [_cf(c) for c in change.values()]  # atoms the patient file omitted
    return patient.model_copy(update={"resolutions": out})


def _cf(c: PivotalCondition) -> Resolution:
    return Resolution(
        atom=c.atom,
        status="observed",
        value=c.target,
        evidence=f"counterfactual: {c.requirement.text}",
        note="counterfactual value (pivotal condition)",
    )


class FlipRate(BaseModel):
    direction: str
    cases: int
    flipped: int

    @property
    def rate(self) -> float | None:
        return self.flipped / self.cases if self.cases else None


@dataclass
class FlipOutcome:
    case: str
    direction: str
    flipped: bool


def pivotal_flip_rate(
    engine, cases: list[tuple[str, TrialProgram, ResolvedPatient]]
) -> tuple[list[FlipRate], list[FlipOutcome]]:
    """Decide each case, apply its primary δ, decide again. Cases without δ (undetermined, or no
    modelled change flips them) are outside the denominator, as in Def. 3."""
    outcomes = []
    for name, program, patient in cases:
        d = engine.decide(program, patient)
        if d.decision == "undetermined" or d.pivotal is None or not d.pivotal.conditions:
            continue
        d2 = engine.decide(program, apply_pivotal(patient, d.pivotal.conditions))
        outcomes.append(
            FlipOutcome(name, d.pivotal.direction, d2.decision not in (d.decision, "undetermined"))
        )
    rates = []
    for direction in ("to_eligible", "to_ineligible"):
        sub = [o for o in outcomes if o.direction == direction]
        rates.append(FlipRate(direction=direction, cases=len(sub), flipped=sum(o.flipped for o in sub)))
    return rates, outcomes
