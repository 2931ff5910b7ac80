"""Missingness policies Π: named, versioned rule sets that resolve atoms the note leaves open.

A rule matches an atom by kind, by the side(s) of the trial that use it, and by domain; the first
matching rule decides. It either imputes a value or leaves the atom unresolved (free for the
solver, to be confirmed at the visit). Per-atom overrides take precedence over rules.

Imputed values are a literal (true / false / a number) or ``not_established``: the value under
which the conditions that mention the atom on that side are not established (a bool atom that
occurs only positively becomes false, only negatively true; a numeric atom gets the interval
that falsifies its comparisons). This is the strict literal reading of appendix I: an
undocumented inclusion requirement is not met, an undocumented exclusion does not apply.

An atom used on both sides is resolved per side; if the two sides disagree it stays unresolved.
Applying a policy is a pure function of (program, mined values, policy).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from . import configs
from .configs import StrictModel, find_config
from .errors import PatientError, PolicyError
from .formula import numeric_in_complex_terms, polarities, simple_comparisons
from .patient import (
    Bounds,
    Imputation,
    MinedValue,
    PolicyRef,
    Resolution,
    ResolvedPatient,
    value_type_problems,
)
from .program import AtomKind, Domain, TrialProgram

ImputeValue = StrictBool | StrictInt | StrictFloat | Literal["not_established"]


class Match(StrictModel):
    kinds: list[AtomKind] | None = Field(default=None, description="atom kinds; omitted = any")
    sides: list[Literal["inclusion", "exclusion"]] | None = Field(default=None, description="omitted = any")
    domains: list[Domain] | None = None


class Action(StrictModel):
    action: Literal["impute", "unresolved"]
    value: ImputeValue | None = None
    reason: str = Field(min_length=1)

    @model_validator(mode="after")
    def _value_iff_impute(self):
        if (self.action == "impute") != (self.value is not None):
            raise ValueError("'impute' needs a value; 'unresolved' takes none")
        return self


class Rule(Action):
    id: str
    match: Match = Field(default_factory=Match)


class Policy(StrictModel):
    name: str
    version: str
    description: str = ""
    rules: list[Rule] = Field(default_factory=list)
    overrides: dict[str, Action] = Field(default_factory=dict, description="atom name -> action")

    @property
    def ref(self) -> PolicyRef:
        return PolicyRef(name=self.name, version=self.version)


def load_policy(name_or_path: str | Path) -> Policy:
    """A policy by name (configs/policies/NAME.yaml) or path. Unknown keys are errors with a
    did-you-mean. No ``--set``: a decision names its policy by name and version, so the rules that
    decided it are always those of one file."""
    path = find_config("policies", name_or_path, PolicyError)
    return _load_policy_file(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _load_policy_file(path: str, _mtime: int) -> Policy:
    policy = configs.load(Policy, path, None, f"policy file {Path(path).name}", PolicyError)
    _refuse_shadowing(policy, Path(path))
    return policy


def _refuse_shadowing(policy: Policy, path: Path) -> None:
    """A decision and its audit record name their policy by name and version, so two different
    files must never share both: a site's policy (``--config-dir``) that reuses a shipped policy's
    name and version with other rules is refused, rather than leaving the record ambiguous."""
    for other in sorted(configs.shipped("configs", "policies").glob("*.yaml")):
        if other.resolve() == path.resolve():
            continue
        try:
            shipped = configs.load(Policy, other, None, f"policy file {other.name}", PolicyError)
        except PolicyError:
            continue
        if shipped.ref == policy.ref and shipped != policy:
            raise PolicyError(
                f"policy file {path.name}: policy '{policy.name}' v{policy.version} differs from the "
                f"shipped policy of that name and version; give the site's policy its own name or "
                f"a new version, so that a decision's record says which rules decided it"
            )


# ---- resolving a patient ----------------------------------------------------------------------
def merge_passes(*passes: list[MinedValue]) -> tuple[dict[str, MinedValue], dict[str, str]]:
    """Merge value-miner passes (inclusion, exclusion). A value beats a null. Two different values
    for one atom are a disagreement: the atom is left open and the disagreement returned."""
    merged: dict[str, MinedValue] = {}
    disagreements: dict[str, str] = {}
    for values in passes:
        for mv in values:
            prev = merged.get(mv.atom)
            has = mv.value is not None or mv.bounds is not None
            if prev is None or (has and prev.value is None and prev.bounds is None):
                merged[mv.atom] = mv
            elif has and (prev.value, prev.bounds) != (mv.value, mv.bounds):
                disagreements[mv.atom] = f"value-miner passes disagree: {prev.value!r} vs {mv.value!r}"
    for atom in disagreements:
        merged[atom] = MinedValue(atom=atom, value=None)
    return merged, disagreements


def resolve(
    program: TrialProgram,
    patient_id: str,
    mined: list[MinedValue] | dict[str, MinedValue],
    policy: Policy,
    notes: dict[str, str] | None = None,
    held_open: dict[str, str] | None = None,
    sources: dict[str, str] | None = None,
) -> ResolvedPatient:
    """Build p_{t,Π}: observed values from the miner, the rest through the policy.

    ``held_open`` (atom -> why) are atoms that stay unresolved with that note, whatever the mined
    value or the policy says: the miner found contradicting values (e.g. two documents), or a
    miner call that asked them failed validation (the chart may hold them). ``sources`` (atom ->
    document id) names the document each evidence quote is from."""
    if isinstance(mined, list):
        mined, disagreements = merge_passes(mined)
        notes = {**disagreements, **(notes or {})}
    notes = notes or {}
    table = program.atom_table()
    problems = []
    for name, mv in mined.items():
        atom = table.get(name)
        if atom is None:
            problems.append(f"'{name}': not an atom of trial program '{program.trial_id}'")
        else:
            problems.extend(f"'{name}': {p}" for p in value_type_problems(atom.domain, mv.value, mv.bounds))
    if problems:
        raise PatientError("value-miner output does not fit the trial program", problems)
    held_open, sources = held_open or {}, sources or {}
    resolutions = []
    for atom in program.atoms:
        mv = mined.get(atom.name)
        if atom.name in held_open:  # a policy never imputes over contradicting or unread evidence
            resolutions.append(
                Resolution(
                    atom=atom.name,
                    status="unresolved",
                    note=_join(notes.get(atom.name), held_open[atom.name]),
                )
            )
        elif mv is not None and (mv.value is not None or mv.bounds is not None):
            resolutions.append(
                Resolution(
                    atom=atom.name,
                    status="observed",
                    value=mv.value,
                    bounds=mv.bounds,
                    evidence=mv.evidence or None,
                    evidence_source=sources.get(atom.name),
                    note=notes.get(atom.name),
                )
            )
        else:
            resolutions.append(impute(program, atom.name, policy, note=notes.get(atom.name)))
    return ResolvedPatient(
        patient_id=patient_id,
        trial_id=program.trial_id,
        program_hash=program.content_hash or program.compute_hash(),
        policy=policy.ref,
        resolutions=resolutions,
    )


def apply_policy(program: TrialProgram, patient: ResolvedPatient, policy: Policy) -> ResolvedPatient:
    """Re-resolve the patient's unresolved atoms (and atoms it omits) under ``policy``; observed
    and already-imputed values are kept."""
    if patient.policy == policy.ref:
        return patient  # applying a policy is idempotent
    have = patient.by_atom()
    out = []
    for atom in program.atoms:
        r = have.get(atom.name)
        out.append(
            r
            if r is not None and r.resolved
            else impute(program, atom.name, policy, note=r.note if r else None)
        )
    return patient.model_copy(update={"resolutions": out, "policy": policy.ref})


def impute(program: TrialProgram, name: str, policy: Policy, note: str | None = None) -> Resolution:
    atom = program.atom_table()[name]
    analysis = _analysis(program)
    sides = sorted(analysis.sides.get(name, set()))
    if name in policy.overrides:
        choices = {"override": (f"override:{name}", policy.overrides[name])}
    else:
        choices = {}
        for side in sides or ["unused"]:
            rule = next((r for r in policy.rules if _matches(r.match, atom.kind, side, atom.domain)), None)
            choices[side] = (rule.id, rule) if rule else ("default", None)
    outcomes = {
        side: _outcome(analysis, name, side, rule_id, action) for side, (rule_id, action) in choices.items()
    }
    distinct = {(o[0], repr(o[1]), repr(o[2])) for o in outcomes.values()}
    if len(distinct) > 1:
        detail = "; ".join(f"{s}: {o[3]}" for s, o in sorted(outcomes.items()))
        return Resolution(
            atom=name, status="unresolved", note=_join(note, f"policy rules disagree across sides ({detail})")
        )
    value, bounds, rule_id, reason = next(iter(outcomes.values()))
    if value is None and bounds is None:
        return Resolution(atom=name, status="unresolved", note=_join(note, reason))
    return Resolution(
        atom=name,
        status="imputed",
        value=value,
        bounds=bounds,
        note=note,
        imputation=Imputation(policy=policy.name, policy_version=policy.version, rule=rule_id, reason=reason),
    )


def _join(a: str | None, b: str | None) -> str | None:
    return "; ".join(x for x in (a, b) if x) or None


def _matches(m: Match, kind: str, side: str, domain: str) -> bool:
    return (
        (m.kinds is None or kind in m.kinds)
        and (m.sides is None or side in m.sides)
        and (m.domains is None or domain in m.domains)
    )


def _outcome(analysis: _Analysis, name: str, side: str, rule_id: str, action: Action | None):
    """(value, bounds, rule id, reason) for one side; value and bounds None = unresolved."""
    if action is None or action.action == "unresolved":
        reason = action.reason if action else "no policy rule matches; left for the screening visit"
        return None, None, rule_id, reason
    domain = analysis.domains[name]
    if action.value != "not_established":
        problems = value_type_problems(domain, action.value, None)
        if problems:
            return None, None, rule_id, f"rule '{rule_id}' cannot impute: {problems[0]}"
        value = action.value
        if domain == "int" and isinstance(value, float):
            value = int(value)
        return value, None, rule_id, action.reason
    if domain == "bool":
        pol = analysis.polarity.get((name, side), set())
        if pol == {"+"} or not pol:
            return False, None, rule_id, action.reason
        if pol == {"-"}:
            return True, None, rule_id, action.reason
        return (
            None,
            None,
            rule_id,
            f"{action.reason} (not applied: '{name}' occurs with both polarities on the {side} side)",
        )
    bounds = analysis.unestablished_bounds.get((name, side))
    if bounds is None:
        return (
            None,
            None,
            rule_id,
            f"{action.reason} (not applied: no single interval leaves '{name}' unestablished)",
        )
    return None, bounds, rule_id, action.reason


class _Analysis:
    """Per-program facts the policy needs: sides, polarity per side, bounds per side."""

    def __init__(self, program: TrialProgram):
        self.sides = program.atom_sides()
        self.domains = {a.name: a.domain for a in program.atoms}
        self.polarity: dict[tuple[str, str], set[str]] = {}
        comparisons: dict[tuple[str, str], list] = {}
        complex_numeric: set[tuple[str, str]] = set()
        for _, side, cr in program.criteria():
            for name, pol in polarities(cr.formula).items():
                self.polarity.setdefault((name, side), set()).update(pol)
            for atom, rel, c, positive in simple_comparisons(cr.formula):
                comparisons.setdefault((atom, side), []).append((rel, c, positive))
            for name in numeric_in_complex_terms(cr.formula):
                complex_numeric.add((name, side))
        self.unestablished_bounds: dict[tuple[str, str], Bounds] = {}
        for key, comps in comparisons.items():
            if key in complex_numeric:
                continue
            b = _falsifying_interval(comps)
            if b is not None:
                self.unestablished_bounds[key] = b


_ANALYSES: dict[str, _Analysis] = {}


def _analysis(program: TrialProgram) -> _Analysis:
    key = program.content_hash or program.compute_hash()
    if key not in _ANALYSES:
        if len(_ANALYSES) > 512:
            _ANALYSES.clear()
        _ANALYSES[key] = _Analysis(program)
    return _ANALYSES[key]


def _falsifying_interval(comps: list[tuple[str, float, bool]]) -> Bounds | None:
    """Interval where every positive comparison is false and every negative one true."""
    lo, lo_s, hi, hi_s = None, False, None, False
    for rel, c, positive in comps:
        need = (
            rel
            if not positive
            else {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}[rel]
        )
        if need in ("gt", "ge"):
            strict = need == "gt"
            if lo is None or c > lo or (c == lo and strict):
                lo, lo_s = c, strict
        elif need in ("lt", "le"):
            strict = need == "lt"
            if hi is None or c < hi or (c == hi and strict):
                hi, hi_s = c, strict
        else:
            return None  # "= c" or "!= c" is not an interval we impute
    try:
        return Bounds(lo=lo, hi=hi, lo_strict=lo_s, hi_strict=hi_s)
    except ValueError:
        return None
