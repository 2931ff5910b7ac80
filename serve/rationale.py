"""A decision's rationale as the service records and returns it, for a match and for a review
alike: the core's rationale (`verdict.core.rationale`), plus what the formalizer adds to it: the
values the documents disagree on (left open) and what the opt-in arbiter did."""

from __future__ import annotations

import json

from verdict.core.decision import Decision
from verdict.core.patient import ResolvedPatient
from verdict.core.program import TrialProgram
from verdict.core.rationale import md, rationale_json, render_markdown
from verdict.data_gen.formalizer import PassageConflict


def render_rationale(
    program: TrialProgram,
    patient: ResolvedPatient,
    decision: Decision,
    conflicts: list[PassageConflict],
    arbiter: dict | None = None,
) -> tuple[str, dict]:
    """(markdown, JSON) of a decision: the one rendering a match and a review both record."""
    markdown = (
        render_markdown(program, patient, decision)
        + conflicts_markdown(conflicts)
        + arbiter_markdown(arbiter)
    )
    rationale = rationale_json(program, patient, decision)
    rationale["extraction_conflicts"] = [c.model_dump(mode="json") for c in conflicts]
    return markdown, rationale


def conflicts_markdown(conflicts: list[PassageConflict]) -> str:
    """The rationale's section on values the documents disagree on (the atoms were left open)."""
    if not conflicts:
        return ""
    out = ["", "", "### Documents disagree (left open, confirm in the chart)"]
    for c in conflicts:
        said = "; ".join(
            f'document `{f.document}`: {f.shown(c.atom)} ("{md(f.evidence)}")' for f in c.findings
        )
        out.append(f"- {c.atom}: {said}")
    return "\n".join(out)


def arbiter_markdown(arbiter: dict | None) -> str:
    """The rationale's section on the arbiter's overrides (what the decision used instead of the
    miner's values), or why it was not applied."""
    if arbiter is None:
        return ""
    out = ["", "", "### Arbiter (extraction conflicts re-read in the chart)"]
    if arbiter["status"] == "failed":
        out.append("- no usable answer: the facts in conflict stay set aside")
    elif arbiter["status"] == "no_override":
        out.append("- no faithful correction found: the facts in conflict stay set aside")
    for o in arbiter["overrides"]:
        value = "left open" if o["value"] is None else f"= {json.dumps(o['value'])}"
        quote = f' ("{md(o["evidence"])}")' if o["evidence"] else ""
        out.append(f"- {o['atom']} {value}{quote}: {md(o['reason'])}")
    return "\n".join(out)
