"""Deterministic rationale for clinicians (Markdown and JSON), rendered only from the Decision.

It restates; it never decides. Numeric conditions are stated as the requirement the trial
imposes, not as a solver's witness value. Text from criteria, definitions and notes is untrusted:
the Markdown escapes it (`md`), so no HTML, link or image in it renders in an EHR that shows it.
"""

from __future__ import annotations

from .decision import Decision, PivotalCondition
from .formula import fmt_number
from .patient import ResolvedPatient
from .program import TrialProgram

# Labels are about the requirement; an exclusion's requirement is that it does not apply.
MARK = {
    "inclusion": {"satisfied": "met", "violated": "NOT met", "deferred": "open (confirm at visit)"},
    "exclusion": {
        "satisfied": "does not apply",
        "violated": "APPLIES (excludes)",
        "deferred": "open (confirm at visit)",
    },
}


_MD_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]", "`": "\\`", "\\": "\\\\"}
)


def md(text) -> str:
    """Untrusted text made inert in Markdown: HTML (`<`, `>`, `&`) as entities, link and image
    brackets, code ticks and backslashes escaped. (Requirements the engine writes from atom names
    and numbers, like `creat <= 2.0`, are not untrusted and stay as they are.)"""
    return str(text).translate(_MD_ESCAPES)


def _val(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt_number(v) if isinstance(v, (int, float)) else str(v)


def _label(definition: str) -> str:
    return definition.rstrip(". ")


def _pivot_text(program: TrialProgram, p: PivotalCondition) -> str:
    atom = program.atom_table()[p.atom]
    if atom.domain == "bool":
        want = "confirmed present" if p.target else "confirmed absent"
        now = "open in the chart" if p.current is None else f"now: {_val(p.current)}"
        return f"{md(_label(atom.definition))} - {want} ({now})"
    if p.current is not None:
        now = f"now {_val(p.current)}"
    elif p.current_bounds is not None:
        now = "now " + p.current_bounds.text(p.atom)
    else:
        now = "not in the chart"
    return f"{p.requirement.text} ({now}; {md(_label(atom.definition))})"


def rationale_json(program: TrialProgram, patient: ResolvedPatient, d: Decision) -> dict:
    """The structured rationale a UI renders: the same content as the Markdown."""
    atoms = program.atom_table()
    res = patient.by_atom()
    criteria = []
    for lb in d.labels:
        cr = next(c for co, _, c in program.criteria() if co.id == lb.cohort and c.id == lb.criterion)
        criteria.append(
            {
                "cohort": lb.cohort,
                "criterion": lb.criterion,
                "side": lb.side,
                "label": lb.label,
                "text": cr.text,
                "evidence": [
                    {
                        "atom": a,
                        "value": res[a].value,
                        "bounds": res[a].bounds.model_dump() if res[a].bounds else None,
                        "status": res[a].status,
                        "quote": res[a].evidence,
                    }
                    for a in lb.facts
                    if a in res
                ],
                "open": lb.open_atoms,
            }
        )
    confirm = [
        {
            "atom": a.atom,
            "class": a.cls,
            "definition": atoms[a.atom].definition,
            "requirement": a.requirement.text if a.requirement else None,
            "criteria": a.criteria,
        }
        for a in d.assumptions
        if a.cls != "inert"
    ]
    change = []
    if d.pivotal:
        change = [
            {"atom": p.atom, "action": p.action, "text": _pivot_text(program, p)}
            for p in d.pivotal.conditions
        ]
    return {
        "trial_id": d.trial_id,
        "patient_id": d.patient_id,
        "decision": d.decision,
        "summary": d.trace.summary,
        "policy": d.policy.model_dump() if d.policy else None,
        "criteria": criteria,
        "to_confirm": confirm,
        "would_change": change,
        "conflicts": [c.model_dump() for c in d.conflicts],
        "reason": d.reason,
    }


def render_markdown(program: TrialProgram, patient: ResolvedPatient, d: Decision) -> str:
    atoms = program.atom_table()
    res = patient.by_atom()
    pol = f" under policy `{d.policy.name}` v{d.policy.version}" if d.policy else ""
    out = [
        f"## {md(d.trial_id)} / {md(d.patient_id)}: **{d.decision.upper()}**{pol}",
        "",
        md(d.trace.summary),
    ]
    if d.reason:
        out += ["", f"Reason: {md(d.reason)}"]
    if d.labels:
        out += ["", "### Criteria"]
        texts = {(co.id, c.id): c.text for co, _, c in program.criteria()}
        for lb in d.labels:
            cohort = f"[{lb.cohort}] " if len(program.cohorts) > 1 else ""
            line = (
                f"- {cohort}{lb.side} `{lb.criterion}` - {MARK[lb.side][lb.label]}: "
                f"{md(texts[(lb.cohort, lb.criterion)])}"
            )
            quotes = []
            for a in lb.facts:
                r = res.get(a)
                if r is None:
                    continue
                shown = r.bounds.text(a) if r.bounds else f"{a} = {_val(r.value)}"
                src = (
                    f'"{md(r.evidence)}"'
                    if r.status == "observed" and r.evidence
                    else (f"imputed by rule `{r.imputation.rule}`" if r.imputation else r.status)
                )
                quotes.append(f"{shown} ({src})")
            if quotes:
                line += "\n  - evidence: " + "; ".join(quotes)
            out.append(line)
    confirm = [a for a in d.assumptions if a.cls != "inert"]
    if d.decision == "eligible":
        out += ["", "### To confirm at the screening visit"]
        if not confirm:
            out.append("- nothing: the chart establishes every condition the decision rests on")
        for a in confirm:
            what = a.requirement.text if a.requirement else "one admissible value among alternatives"
            if a.cls == "forced" and atoms[a.atom].domain == "bool":
                what = "must be " + ("present" if a.value else "absent")
            out.append(f"- {md(_label(atoms[a.atom].definition))}: {what} ({a.cls})")
    if d.pivotal is not None:
        verb = "eligible" if d.pivotal.direction == "to_eligible" else "ineligible"
        out += ["", f"### What would make the patient {verb}"]
        if not d.pivotal.conditions:
            out.append(f"- {md(d.pivotal.note or 'no change of the modelled conditions')}")
        for p in d.pivotal.conditions:
            out.append(f"- {_pivot_text(program, p)}")
        if d.pivotal.alternatives:
            out.append(f"- ({len(d.pivotal.alternatives)} other minimal way(s) exist)")
    if d.conflicts:
        out += ["", "### Extraction conflicts (set aside, confirm in the chart)"]
        for c in d.conflicts:
            out.append(f"- {md(c.text())}")
    if d.incomplete:
        out += ["", "### Not computed (solver limit)"] + [f"- {md(x)}" for x in d.incomplete]
    return "\n".join(out)


def summary_json(program: TrialProgram, patient: ResolvedPatient, d: Decision, source: str = "") -> dict:
    """One line of `verdict decide --format json`: the fixed interop contract plus context."""
    pivotal = []
    if d.pivotal:
        for p in d.pivotal.conditions:
            pivotal.append(
                {
                    "atom": p.atom,
                    "current": p.current,
                    "target": p.target,
                    "requirement": p.requirement.text,
                    "action": p.action,
                }
            )
    return {
        "source": source,
        "trial_id": d.trial_id,
        "patient_id": d.patient_id,
        "decision": d.decision,
        "reason": d.reason,
        "assumptions": [{"atom": a.atom, "value": a.value, "class": a.cls} for a in d.assumptions],
        "pivotal": pivotal,
        "pivotal_direction": d.pivotal.direction if d.pivotal else None,
        "sides": {
            s.cohort: {
                "inclusion": s.inclusion_satisfiable,
                "exclusion": s.exclusion_satisfiable,
                "admits": s.admits,
            }
            for s in d.cohorts
        },
        "conflicts": [c.model_dump() for c in d.conflicts],
        "labels": {f"{lb.cohort}/{lb.criterion}": lb.label for lb in d.labels},
        "program_hash": d.program_hash,
        "policy": d.policy.model_dump() if d.policy else None,
        "incomplete": d.incomplete,
    }
