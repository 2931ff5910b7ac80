"""Re-deriving a stored decision's resolved patient: one rule for reviews and re-screenings.

A stored decision keeps the resolved patient it was decided on (`artifacts.patient`). Its *base* is
what does not come from the decision's policy:
- observed values (the miner's, or a reviewer's) are kept as they are;
- values imputed by the decision's policy are opened again (the policy is applied anew);
- values imputed by another source (e.g. the authors' recorded miner) are kept;
- an atom left open because the record disagrees with itself (an extraction conflict) stays open:
  no policy imputes over contradicting evidence (`verdict.core.policy.resolve`);
- an atom staged mining left unasked ("not asked: the decision was already settled") stays open:
  it was never read, so no default stands in for it (reading.py completes the mining when it
  matters);
- other open atoms are opened again, their note without the policy's reason text.

Then the changes are applied (a confirmed or corrected value is observed, with the reviewer's
evidence and where it was established; "unknown" opens the atom and clears a conflict) and the
policy resolves the open atoms. No language model is involved.
"""

from __future__ import annotations

import math
import re

from verdict.core.formula import number_problem
from verdict.core.patient import Resolution, ResolvedPatient
from verdict.core.policy import Policy, impute
from verdict.core.program import Atom, TrialProgram
from verdict.core.settled import NOT_ASKED

TRUE_WORDS = frozenset({"true", "yes", "present", "positive", "1"})
FALSE_WORDS = frozenset({"false", "no", "absent", "negative", "0"})
_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")
# What `verdict.core.policy` appends to an open atom's note: a rule's reason (possibly with a
# "(not applied: ...)" tail), the no-rule default, or a disagreement across sides (always last).
_POLICY_TAIL = re.compile(r"(^|; )policy rules disagree across sides \(.*\)$")
_NO_RULE = "no policy rule matches; left for the screening visit"


def conflict_atoms(artifacts: dict) -> set[str]:
    """Atoms a stored decision left open because its record contradicts itself (both layouts: the
    service's passage conflicts name `atom`, imported recorded conflicts `set_aside`)."""
    out: set[str] = set()
    for c in artifacts.get("extraction_conflicts") or []:
        if isinstance(c, dict):
            if isinstance(c.get("atom"), str):
                out.add(c["atom"])
            out.update(a for a in c.get("set_aside") or [] if isinstance(a, str))
    return out


def parse_value(atom: Atom, raw) -> tuple[bool | int | float | None, str | None]:
    """A reviewer's value as the atom's domain wants it: (value, None) or (None, why not). Text is
    accepted as a form sends it: "yes", "1.4", "1.4 mg/dL" (the unit must be the atom's)."""
    if atom.domain == "bool":
        if isinstance(raw, bool):
            return raw, None
        if isinstance(raw, str) and raw.strip().lower() in TRUE_WORDS | FALSE_WORDS:
            return raw.strip().lower() in TRUE_WORDS, None
        return None, f"atom '{atom.name}' is bool: give true or false"
    if isinstance(raw, bool):
        return None, f"atom '{atom.name}' is {atom.domain}: give a number, not a boolean"
    if isinstance(raw, str):
        m = _NUMBER.match(raw)
        if m is None:
            return None, f"atom '{atom.name}' is {atom.domain}: '{raw[:40]}' is not a number"
        number, unit = m.group(1), m.group(2)
        if unit and _unit(unit) != _unit(atom.unit or ""):
            return None, (
                f"unit '{unit[:20]}' is not the atom's unit ('{atom.unit}')"
                if atom.unit
                else f"atom '{atom.name}' has no unit: give the number alone"
            )
        try:
            raw = float(number) if any(ch in number for ch in ".eE") else int(number)
        except (ValueError, OverflowError):
            return None, f"'{raw[:40]}' is not a usable number"
    if isinstance(raw, float) and not math.isfinite(raw):
        return None, "numbers must be finite"
    why = number_problem(raw)
    if why:
        return None, why
    if atom.domain == "int":
        if isinstance(raw, float) and not raw.is_integer():
            return None, f"atom '{atom.name}' is int: {raw!r} is not an integer"
        return int(raw), None
    return raw, None


def _unit(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def previous_of(r: Resolution | None) -> dict:
    """An atom's resolution before a change, as the lineage records it (no quote)."""
    if r is None:
        return {"status": "unresolved"}
    out: dict = {"status": r.status}
    if r.value is not None:
        out["value"] = r.value
    if r.bounds is not None:
        out["bounds"] = r.bounds.model_dump()
    if r.evidence_source:
        out["source"] = r.evidence_source
    if r.imputation is not None:
        out["imputed_by"] = f"{r.imputation.policy}@{r.imputation.policy_version}:{r.imputation.rule}"
    return out


def rederive(
    program: TrialProgram,
    stored: ResolvedPatient,
    stored_policy: str,
    policy: Policy,
    *,
    conflicts: set[str] = frozenset(),
    overrides: dict[str, Resolution | None] | None = None,
    reasons: set[str] = frozenset(),
) -> ResolvedPatient:
    """The patient for `program` under `policy`: the base of `stored` (see the module doc) with
    `overrides` (atom -> an observed resolution, or None: unknown) applied. `stored_policy` is the
    name of the policy `stored` was resolved under; `reasons` are rule reasons that policy may have
    written into notes of open atoms (stripped before the policy writes its own)."""
    overrides = overrides or {}
    have = stored.by_atom()
    reasons = set(reasons) | {r.reason for r in policy.rules}
    out = []
    for atom in program.atoms:
        name = atom.name
        r = have.get(name)
        if name in overrides:
            new = overrides[name]
            if new is not None:
                out.append(new)
                continue
            out.append(impute(program, name, policy, note=None))
        elif r is None:
            out.append(impute(program, name, policy))
        elif r.status == "observed":
            out.append(r)
        elif r.status == "imputed":
            own = r.imputation is not None and r.imputation.policy == stored_policy
            out.append(impute(program, name, policy, note=r.note) if own else r)
        elif name in conflicts or r.note == NOT_ASKED:
            out.append(r)
        else:
            out.append(impute(program, name, policy, note=_without_reasons(r.note, reasons)))
    return ResolvedPatient(
        patient_id=stored.patient_id, trial_id=program.trial_id,
        program_hash=program.content_hash or program.compute_hash(), policy=policy.ref, resolutions=out,
    )  # fmt: skip


def _without_reasons(note: str | None, reasons: set[str]) -> str | None:
    if not note:
        return None
    note = _POLICY_TAIL.sub("", note).replace(_NO_RULE, "")
    kept = [
        p for p in note.split("; ")
        if p and p not in reasons and not any(p.startswith(f"{r} (not applied: ") for r in reasons)
    ]  # fmt: skip
    return "; ".join(kept) or None


def same_atoms(old: TrialProgram, new: TrialProgram) -> bool:
    """Whether resolved values of `old` mean the same for `new`: the same atoms with the same names,
    domains, units, kinds, definitions and time scopes."""

    def key(p: TrialProgram):
        return sorted(
            (
                a.name,
                a.domain,
                a.kind,
                a.unit,
                a.definition,
                a.time_scope.model_dump_json() if a.time_scope else "",
            )
            for a in p.atoms
        )

    return key(old) == key(new)
