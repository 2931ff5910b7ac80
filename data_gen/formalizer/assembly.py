"""Deterministic assembly: per-criterion parser outputs -> one checked `TrialProgram` (paper
appendix A.2, alias remapping), and the inverse (a whole program re-expressed per criterion).

Atom unification rule (documented in docs/data_gen.md):
- Two criteria's atoms are the same chart fact, and merge into one atom, when their names are equal
  ignoring case, their domains are equal, their units are equal after normalization (case, spaces;
  both absent counts as equal) and their time scopes are equal or one is absent. The merged atom is
  the first one met (criteria in trial order: its kind, unit, definition, time scope), with
  `source_criteria` the union.
- The same name with another domain, unit or time scope is a different fact: that criterion's atom
  is renamed `<name>__<criterion id>` (in its formula and definitions too) and reported.
- Near-duplicates are left apart and reported: names equal after dropping separators, a qualifier,
  a common prefix (`has_`, `is_`, `history_of_`, ...) or a unit suffix (`age` / `age_years`), and
  atoms whose definitions are equal after normalization.
Trial-wide definitions: each criterion's local definitions (ids `<criterion id>:<id>`, identical
formulas kept once) and, for every bool atom `stem@@q` whose stem is a declared bool atom,
`stem@@q implies stem`. Cohorts: "main", or one per population label the criteria name, each with
the criteria labelled for it and every unlabelled criterion.

A criterion whose output failed validation (after its one repair) is represented soundly, never
dropped (unless every criterion failed: then there is no program, and the trial is rejected with
the criteria's reasons): a bool atom `criterion_<id>_unformalized` ("the criterion holds; confirm
at screening") is its formula, so the core leaves it open and the rationale lists it under 'to
confirm'. An out-of-scope criterion (consent, logistics, judgment) is left out of the program, as
the whole-trial parser did, and listed in the report.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError
from verdict.core.errors import ProgramError, describe_validation_error
from verdict.core.formula import atoms_in, rename, render
from verdict.core.program import (
    Atom,
    Cohort,
    Criterion,
    Definition,
    ParsedCriterion,
    Provenance,
    TrialProgram,
    check_program,
)

from .criteria import CriterionText

MAIN_COHORT = "main"
_PREFIXES = ("has_history_of_", "history_of_", "has_prior_", "prior_", "has_", "is_", "was_", "had_", "any_")
_UNIT_SUFFIX = re.compile(
    r"_(?:years?|months?|weeks?|days?|hours?|mg_?dl|g_?dl|mmol_?l|percent|pct|kg|cm|mmhg)$"
)


@dataclass
class Assembly:
    program: TrialProgram | None
    report: dict
    problems: list[tuple[str, str]] = field(default_factory=list)  # (category, message): why no program


def unformalized_atom(c: CriterionText) -> str:
    return f"criterion_{re.sub(r'[^A-Za-z0-9]', '_', c.id)}_unformalized"


def _unit(u: str | None) -> str:
    return "".join((u or "").lower().split())


def _compatible(a: Atom, b: Atom) -> str | None:
    """None if a and b are one chart fact, else what differs."""
    if a.domain != b.domain:
        return f"domain {a.domain} vs {b.domain}"
    if _unit(a.unit) != _unit(b.unit):
        return f"unit '{a.unit or ''}' vs '{b.unit or ''}'"
    if a.time_scope is not None and b.time_scope is not None and a.time_scope != b.time_scope:
        return "time scope differs"
    return None


def _stem_key(name: str) -> str:
    n = name.lower().split("@@")[0]
    for p in _PREFIXES:
        if n.startswith(p):
            n = n[len(p) :]
            break
    n = _UNIT_SUFFIX.sub("", n)
    return re.sub(r"[^a-z0-9]", "", n)


def _definition_key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "cohort"


@dataclass
class _Draft:
    """The program while the criteria are placed in trial order: its atoms, definitions and criteria,
    and the report of what was merged, renamed and left out."""

    report: dict
    atoms: dict[str, Atom] = field(default_factory=dict)  # lower-case name -> the program's atom
    sources: dict[str, list[str]] = field(default_factory=dict)  # lower-case name -> criterion ids
    definitions: list[Definition] = field(default_factory=list)
    seen_defs: set[str] = field(default_factory=set)  # formula keys: an identical definition once
    # (criterion, program criterion, the population labels it names)
    placed: list[tuple[CriterionText, Criterion, list[str]]] = field(default_factory=list)


def assemble(
    trial_id: str,
    title: str,
    criteria: list[CriterionText],
    outputs: dict[str, ParsedCriterion],
    failures: dict[str, str],
    *,
    check_satisfiable: Callable[[TrialProgram], None],
    provenance: Provenance | None = None,
) -> Assembly:
    """One program from the criteria's outputs (`outputs` by criterion id; `failures`: id -> reason
    of the criteria whose output was rejected). `check_satisfiable` is the caller's engine's (its
    solver limit, its compiled-program cache): there is no default engine."""
    draft = _Draft(report=_empty_report(len(criteria)))
    for c in criteria:
        _place(draft, c, outputs.get(c.id), failures)
    refused = _nothing_to_assemble(draft.report)
    if refused is not None:
        return refused
    report = draft.report
    report["merged"] = _last_merge_per_atom(report["merged"])
    atom_list = [a.model_copy(update={"source_criteria": draft.sources[k]}) for k, a in draft.atoms.items()]
    _add_qualifier_links(draft, atom_list)
    report["near_duplicates"] = near_duplicates(atom_list)
    cohorts = _cohorts(draft.placed)
    report["cohorts"] = [co.id for co in cohorts]
    try:
        program = check_program(
            TrialProgram(
                trial_id=trial_id,
                title=title,
                atoms=atom_list,
                definitions=draft.definitions,
                cohorts=cohorts,
                provenance=provenance,
            )
        )
    except ValidationError as e:  # e.g. a trial id the core does not accept
        return Assembly(None, report, [("schema", p) for p in describe_validation_error(e, "program")])
    except ProgramError as e:
        return Assembly(None, report, [("program", p) for p in e.problems] or [("program", e.summary)])
    return _if_satisfiable(program, report, check_satisfiable)


def _empty_report(n_criteria: int) -> dict:
    """The assembly report before any criterion is placed."""
    return {
        "criteria": n_criteria,
        "formalized": [],
        "out_of_scope": [],
        "unformalized": [],
        "merged": [],
        "renamed": [],
        "near_duplicates": [],
        "definitions_added": [],
        "cohorts": [],
        "conflict": [],
    }


def _place(draft: _Draft, c: CriterionText, out: ParsedCriterion | None, failures: dict[str, str]) -> None:
    """One criterion into the draft: its unified atoms, formula and definitions; an open atom if its
    output failed; nothing (reported) if it is out of scope."""
    if out is None:  # rejected after its repair, or never answered
        _place_unformalized(draft, c, failures.get(c.id, "no output"))
        return
    if not out.in_scope:
        draft.report["out_of_scope"].append({"id": c.id, "reason": out.reason})
        return
    mapping = _unify_atoms(draft, c, out.atoms)
    formula = rename(out.formula, mapping)
    draft.placed.append((c, Criterion(id=c.id, text=c.text, formula=formula), list(out.cohorts)))
    draft.report["formalized"].append(c.id)
    _add_definitions(draft, c, out.definitions, mapping)


def _place_unformalized(draft: _Draft, c: CriterionText, reason: str) -> None:
    """A failed criterion as a bool atom of its own, which the core leaves open ('to confirm')."""
    name = unformalized_atom(c)
    draft.atoms[name.lower()] = Atom(
        name=name,
        domain="bool",
        kind="other",
        definition=f'Criterion {c.id} ({c.side}) holds: "{c.text}" (it could not be '
        "formalized; confirm at screening).",
    )
    draft.sources[name.lower()] = [c.id]
    draft.placed.append((c, Criterion(id=c.id, text=c.text, formula=name), []))
    draft.report["unformalized"].append({"id": c.id, "reason": reason})


def _unify_atoms(draft: _Draft, c: CriterionText, atoms: list[Atom]) -> dict[str, str]:
    """Merge the criterion's atoms into the program's by the unification rule (module docstring);
    returns its atom names -> the program's (a clash renamed `<name>__<criterion id>`)."""
    mapping: dict[str, str] = {}
    for a in atoms:
        key = a.name.lower()
        have = draft.atoms.get(key)
        if have is None:
            draft.atoms[key] = a.model_copy(update={"source_criteria": []})
            draft.sources[key] = [c.id]
            mapping[a.name] = a.name
            continue
        why = _compatible(have, a)
        if why is None:
            mapping[a.name] = have.name
            if c.id not in draft.sources[key]:
                draft.sources[key].append(c.id)
                draft.report["merged"].append({"atom": have.name, "criteria": list(draft.sources[key])})
            continue
        new = f"{a.name}__{c.id}"
        draft.atoms[new.lower()] = a.model_copy(update={"name": new, "source_criteria": []})
        draft.sources[new.lower()] = [c.id]
        mapping[a.name] = new
        draft.report["renamed"].append({"atom": a.name, "as": new, "criterion": c.id, "why": why})
    return mapping


def _add_definitions(draft: _Draft, c: CriterionText, definitions: list, mapping: dict[str, str]) -> None:
    """The criterion's local definitions, trial-wide as `<criterion id>:<id>`; an identical formula once."""
    for d in definitions:
        f = rename(d.formula, mapping)
        key = _formula_key(f)
        if key in draft.seen_defs:
            continue
        draft.seen_defs.add(key)
        # A definition's text is its formula rendered, unless the output says more (outputs leave it out).
        draft.definitions.append(
            Definition(id=f"{c.id}:{d.id}", kind=d.kind, text=d.text or render(f), formula=f)
        )


def _nothing_to_assemble(report: dict) -> Assembly | None:
    """No program when no criterion is chart-checkable, or when every one failed (a program of
    open atoms would decide nothing); None when there is something to assemble."""
    if not (report["formalized"] or report["unformalized"]):
        why = f"no criterion of the trial is chart-checkable ({len(report['out_of_scope'])} out of scope)"
        return Assembly(None, report, [("program", why)])
    if not report["formalized"]:
        return Assembly(
            None,
            report,
            [
                (f["reason"], f"criterion {f['id']}: its output failed validation after one repair")
                for f in report["unformalized"]
            ],
        )
    return None


def _last_merge_per_atom(merged: list[dict]) -> list[dict]:
    """Each merged atom once, with every criterion it was merged from (its last entry)."""
    last: dict[str, dict] = {}
    for m in merged:
        last[m["atom"]] = m
    return list(last.values())


def _add_qualifier_links(draft: _Draft, atom_list: list[Atom]) -> None:
    """`stem@@q implies stem` for every bool qualifier whose stem is a declared bool atom."""
    names = {a.name for a in atom_list}
    for a in atom_list:
        stem = a.name.split("@@")[0]
        if (
            "@@" in a.name
            and a.domain == "bool"
            and stem in names
            and draft.atoms[stem.lower()].domain == "bool"
        ):
            f = {"op": "implies", "if": a.name, "then": stem}
            d = Definition.model_validate(
                {"id": f"qualifier:{a.name}", "kind": "qualifier_implies_stem", "formula": f}
            )
            if _formula_key(d.formula) not in draft.seen_defs:
                draft.seen_defs.add(_formula_key(d.formula))
                draft.definitions.append(d)
                draft.report["definitions_added"].append(d.id)


def _if_satisfiable(
    program: TrialProgram, report: dict, check_satisfiable: Callable[[TrialProgram], None]
) -> Assembly:
    """The program if its criteria can hold together; else none, naming a minimal conflicting set."""
    try:
        check_satisfiable(program)
    except ProgramError as e:
        report["conflict"] = conflicting_criteria(program, check_satisfiable)
        msgs = [("unsatisfiable", p) for p in e.problems] or [("unsatisfiable", e.summary)]
        if report["conflict"]:
            msgs.append(("unsatisfiable", "criteria in conflict: " + ", ".join(report["conflict"])))
        return Assembly(None, report, msgs)
    return Assembly(program, report)


def _formula_key(f) -> str:
    import json

    return json.dumps(f if isinstance(f, str) else f.model_dump(by_alias=True), sort_keys=True)


def _cohorts(placed: list[tuple[CriterionText, Criterion, list[str]]]) -> list[Cohort]:
    labels: list[str] = []
    for _, _, ls in placed:
        labels += [x for x in ls if x not in labels]
    if not labels:
        return [
            Cohort(
                id=MAIN_COHORT,
                inclusion=[cr for c, cr, _ in placed if c.side == "inclusion"],
                exclusion=[cr for c, cr, _ in placed if c.side == "exclusion"],
            )
        ]
    out, ids = [], set()
    for label in labels:
        cid = _slug(label)
        while cid in ids:
            cid += "_"
        ids.add(cid)
        mine = [(c, cr) for c, cr, ls in placed if not ls or label in ls]
        out.append(
            Cohort(
                id=cid,
                label=label,
                inclusion=[cr for c, cr in mine if c.side == "inclusion"],
                exclusion=[cr for c, cr in mine if c.side == "exclusion"],
            )
        )
    return out


def near_duplicates(atoms: list[Atom]) -> list[dict]:
    """Pairs of distinct atoms that may be one fact: left apart, reported for review."""
    out = []
    for i, a in enumerate(atoms):
        for b in atoms[i + 1 :]:
            if a.name.split("@@")[0] == b.name.split("@@")[0]:
                continue  # a qualifier and its stem (or two windows of one stem): linked by definitions
            if _stem_key(a.name) and _stem_key(a.name) == _stem_key(b.name):
                out.append(
                    {"atoms": [a.name, b.name], "why": "names equal after dropping prefix/qualifier/unit"}
                )
            elif _definition_key(a.definition) == _definition_key(b.definition):
                out.append({"atoms": [a.name, b.name], "why": "same definition"})
    return out


def conflicting_criteria(
    program: TrialProgram, check_satisfiable: Callable[[TrialProgram], None]
) -> list[str]:
    """A minimal set of criteria that cannot hold together (deletion-based); [] if the definitions
    alone are unsatisfiable or no criterion can be removed."""

    def sat(keep: set[str]) -> bool:
        cohorts = [
            co.model_copy(
                update={
                    "inclusion": [c for c in co.inclusion if c.id in keep],
                    "exclusion": [c for c in co.exclusion if c.id in keep],
                }
            )
            for co in program.cohorts
        ]
        cohorts = [co for co in cohorts if co.inclusion or co.exclusion]
        if not cohorts:
            return True
        try:
            check_satisfiable(program.model_copy(update={"cohorts": cohorts, "content_hash": None}))
            return True
        except ProgramError:
            return False

    ids = [cr.id for _, _, cr in program.criteria()]
    keep = set(ids)
    if sat(keep):
        return []
    for cid in ids:
        if sat(keep - {cid}) is False:
            keep.discard(cid)
    return [c for c in dict.fromkeys(ids) if c in keep]


def criterion_outputs(program: TrialProgram) -> dict[str, ParsedCriterion]:
    """A whole program re-expressed as per-criterion outputs (criterion id -> output): each
    criterion's formula with the atoms it uses; a definition goes to the first criterion that
    uses one of its atoms, directly or through another definition (with the atoms it needs; one
    about no criterion's atoms goes to the first criterion); cohort labels where the program has
    several cohorts and the criterion is not in all of them."""
    cohorts_of: dict[str, list[str]] = {}
    first: dict[str, Criterion] = {}
    for co, _, cr in program.criteria():
        first.setdefault(cr.id, cr)
        cohorts_of.setdefault(cr.id, []).append(co.label or co.id)
    defs_of: dict[str, list[Definition]] = {}
    used: dict[str, set[str]] = {cid: atoms_in(cr.formula) for cid, cr in first.items()}
    pending = list(program.definitions)
    while pending:  # a definition may reach a criterion only through another one's atoms
        left = []
        for d in pending:
            names = atoms_in(d.formula)
            owner = next((cid for cid in first if used[cid] & names), None)
            if owner is None:
                left.append(d)
                continue
            defs_of.setdefault(owner, []).append(d)
            used[owner] |= names
        if len(left) == len(pending):  # about atoms no criterion uses: kept, with the first criterion
            if first:
                owner = next(iter(first))
                defs_of.setdefault(owner, []).extend(left)
            break
        pending = left
    out = {}
    n_cohorts = len(program.cohorts)
    for cid, cr in first.items():
        names = set(used[cid])
        for d in defs_of.get(cid, []):
            names |= atoms_in(d.formula)
        atoms = [a.model_copy(update={"source_criteria": []}) for a in program.atoms if a.name in names]
        labels = cohorts_of[cid] if 1 < n_cohorts and len(set(cohorts_of[cid])) < n_cohorts else []
        bools = {a.name for a in atoms if a.domain == "bool"}
        out[cid] = ParsedCriterion(
            in_scope=True,
            atoms=atoms,
            formula=cr.formula,
            definitions=[  # the qualifier links assembly adds itself are not part of the output, nor is a
                # text that only renders the formula (assembly renders it again): completions stay short
                d.model_copy(
                    update={
                        "id": d.id.split(":")[-1] or d.id,
                        "text": "" if d.text == render(d.formula) else d.text,
                    }
                )
                for d in defs_of.get(cid, [])
                if not _derived_qualifier_link(d, bools)
            ],
            cohorts=labels,
        )
    return out


def _derived_qualifier_link(d: Definition, bools: set[str]) -> bool:
    """`stem@@q implies stem` over two declared bool atoms: assembly adds it for every such pair."""
    f = d.formula
    if not isinstance(f, dict) or f.get("op") != "implies":
        f = getattr(f, "model_dump", lambda **_: None)(mode="json", by_alias=True)
    if not isinstance(f, dict) or f.get("op") != "implies":
        return False
    q, stem = f.get("if"), f.get("then")
    return (
        isinstance(q, str)
        and isinstance(stem, str)
        and "@@" in q
        and q.split("@@")[0] == stem
        and q in bools
        and stem in bools
    )
