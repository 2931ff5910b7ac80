"""The trial program: typed atoms (paper Def. 4), cohorts of inclusion/exclusion criteria, and
auxiliary definitional constraints kept apart from eligibility requirements.

Semantics. A patient is eligible iff the definitions hold and *some* cohort admits him; a cohort
admits him iff every inclusion formula is true and every exclusion formula is false. Definitions
(qualifier implies stem, derived quantities, counts) describe the atom vocabulary, so they are
trial-wide: they hold in every cohort and in every counterfactual patient.

Time. There is no date sort. Time enters through (a) time-scoped atoms, whose ``time_scope`` says
which period a bool finding refers to ("current", "ever", "within 6 months"), and (b) duration
atoms: numeric atoms of kind ``timing`` with a unit such as "days" or "months" ("months since last
chemotherapy"). Both keep every formula in linear arithmetic over typed atoms.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from .configs import StrictModel
from .errors import ProgramError, describe_validation_error
from .formula import AtomName, BoundedFormula, Formula, atom_refs, atoms_in, identifier

Domain = Literal["bool", "int", "real"]
AtomKind = Literal["diagnosis", "medication", "lab_value", "procedure", "demographic", "timing", "other"]
Side = Literal["inclusion", "exclusion"]
Id = identifier(r"^[A-Za-z0-9_][A-Za-z0-9_.:/@\-]*$")
PROGRAM_FORMAT = "verdict.trial_program/v1"


class TimeScope(StrictModel):
    """Which period a time-scoped atom refers to."""

    kind: Literal["current", "ever", "within", "before"] = Field(
        description="current state; any time in history; within the last `amount` `unit`; longer ago "
        "than that"
    )
    amount: float | None = Field(default=None, ge=0)
    unit: Literal["hours", "days", "weeks", "months", "years"] | None = None
    anchor: str | None = Field(default=None, description="reference event if not today, e.g. 'randomization'")

    @model_validator(mode="after")
    def _window_needs_amount(self):
        if self.kind in ("within", "before") and (self.amount is None or self.unit is None):
            raise ValueError(f"time_scope kind '{self.kind}' needs both amount and unit")
        return self


class Atom(StrictModel):
    """The smallest chart-checkable condition (paper Def. 4: kind, domain, description, source link)."""

    name: AtomName
    domain: Domain
    kind: AtomKind
    unit: str | None = Field(default=None, description="unit of a numeric atom, e.g. 'mg/dL', 'years'")
    definition: str = Field(min_length=1, description="self-contained: what to check in the chart")
    time_scope: TimeScope | None = None
    source_criteria: list[str] = Field(default_factory=list, description="ids of the criteria it comes from")


class Criterion(StrictModel):
    id: Id
    text: str = Field(description="the criterion as written in the trial")
    formula: BoundedFormula = Field(
        description="inclusion: must hold; exclusion: excludes the patient when it holds"
    )


class Definition(StrictModel):
    """An auxiliary definitional constraint: true of the vocabulary, never an eligibility requirement."""

    id: Id
    kind: Literal["qualifier_implies_stem", "definition", "count", "continuity", "other"] = "definition"
    text: str = ""
    formula: BoundedFormula


class Cohort(StrictModel):
    id: Id
    label: str = ""
    inclusion: list[Criterion] = Field(default_factory=list)
    exclusion: list[Criterion] = Field(default_factory=list)


class ParsedTrial(StrictModel):
    """What the trial parser (teacher or student) emits: the program without bookkeeping."""

    atoms: list[Atom] = Field(min_length=1)
    definitions: list[Definition] = Field(default_factory=list)
    cohorts: list[Cohort] = Field(min_length=1)


class ParsedCriterion(StrictModel):
    """What the per-criterion trial parser emits for one criterion; `verdict.data_gen.formalizer.assembly`
    makes one trial program from a trial's outputs. The side (inclusion/exclusion) is the caller's:
    an exclusion formula describes the excluding condition, not its negation."""

    in_scope: bool = Field(
        description="false: not chart-checkable (consent, willingness, logistics, "
        "investigator judgment); then no atoms and no formula"
    )
    reason: str = Field(default="", description="why the criterion is out of scope (required then)")
    atoms: list[Atom] = Field(default_factory=list, description="every atom the formula and definitions use")
    formula: BoundedFormula | None = Field(default=None, description="the condition the criterion states")
    definitions: list[Definition] = Field(
        default_factory=list,
        description="local definitions (a qualifier implies its stem, derived quantities)",
    )
    cohorts: list[str] = Field(
        default_factory=list,
        description="labels of the populations the criterion "
        "applies to when it names some ('Part B'); empty: every population",
    )

    @model_validator(mode="after")
    def _scope_matches_content(self):
        if self.in_scope and self.formula is None:
            raise ValueError("an in-scope criterion needs a formula (and the atoms it uses)")
        if not self.in_scope and (self.formula is not None or self.atoms):
            raise ValueError("an out-of-scope criterion has no atoms and no formula (give the reason)")
        if not self.in_scope and not self.reason.strip():
            raise ValueError("an out-of-scope criterion needs its reason")
        return self


class Provenance(StrictModel):
    source: str = Field(description="who wrote it: 'parser:<model>', 'reference-import', 'hand', ...")
    details: dict[str, str] = Field(default_factory=dict)


class TrialProgram(ParsedTrial):
    format: Literal["verdict.trial_program/v1"] = PROGRAM_FORMAT
    trial_id: Id
    title: str = ""
    content_hash: str | None = Field(default=None, description="sha256 of the semantic content; set on load")
    provenance: Provenance | None = None

    # -- identity ------------------------------------------------------------------------------
    def compute_hash(self) -> str:
        """Hash of what decides eligibility (id, atoms, definitions, cohorts); title and provenance
        are excluded so re-importing the same program from another source keeps its version."""
        # pydantic's serializer writes fields in the models' declared order: canonical and fast
        canon = self.model_dump_json(by_alias=True, include={"trial_id", "atoms", "definitions", "cohorts"})
        return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()

    # -- lookups -------------------------------------------------------------------------------
    def atom_table(self) -> dict[str, Atom]:
        return {a.name: a for a in self.atoms}

    def criteria(self) -> list[tuple[Cohort, Side, Criterion]]:
        return [
            (c, side, cr)
            for c in self.cohorts
            for side in ("inclusion", "exclusion")
            for cr in getattr(c, side)
        ]

    def atom_sides(self) -> dict[str, set[str]]:
        """On which side(s) each atom is used, directly or through definitions linking it to a
        criterion atom (a qualifier's stem takes the side of the qualifier)."""
        sides: dict[str, set[str]] = {a.name: set() for a in self.atoms}
        for _, side, cr in self.criteria():
            for name in atoms_in(cr.formula):
                sides.setdefault(name, set()).add(side)
        changed = True
        while changed:  # propagate through definitions until stable
            changed = False
            for d in self.definitions:
                names = atoms_in(d.formula)
                union = set().union(*(sides.get(n, set()) for n in names))
                for n in names:
                    if not union <= sides.setdefault(n, set()):
                        sides[n] |= union
                        changed = True
        return sides


def load_program(data: dict | str | bytes) -> TrialProgram:
    """Parse and check a trial program; raise ProgramError naming every problem found."""
    try:
        program = (
            TrialProgram.model_validate_json(data)
            if isinstance(data, (str, bytes))
            else TrialProgram.model_validate(data)
        )
    except ValidationError as e:
        raise ProgramError("invalid trial program", describe_validation_error(e, "program")) from None
    except ValueError as e:  # malformed JSON text
        raise ProgramError(f"invalid trial program: {e}") from None
    return check_program(program)


def check_program(program: TrialProgram) -> TrialProgram:
    """Static checks: unique ids, declared atoms, types, source links, stored hash.
    Satisfiability is checked by the engine (``engine.check_satisfiable``)."""
    problems: list[str] = []
    table: dict[str, Atom] = {}
    for i, a in enumerate(program.atoms):
        if a.name in table:
            problems.append(f"atoms[{i}]: duplicate atom name '{a.name}'")
        table[a.name] = a
        if a.domain == "bool" and a.unit:
            problems.append(f"atoms[{i}] '{a.name}': a bool atom has no unit (got '{a.unit}')")

    def check(formula: Formula, where: str) -> None:
        for name, path, as_formula in atom_refs(formula):
            atom = table.get(name)
            if atom is None:
                problems.append(f"{where}.formula{path}: undeclared atom '{name}'")
            elif as_formula and atom.domain != "bool":
                problems.append(
                    f"{where}.formula{path}: atom '{name}' is {atom.domain} but is used as a condition"
                )
            elif not as_formula and atom.domain == "bool":
                problems.append(f"{where}.formula{path}: atom '{name}' is bool but is used as a number")

    def unique(ids: list[str], where: str) -> None:
        seen: set[str] = set()
        for x in ids:
            if x in seen:
                problems.append(f"{where}: duplicate id '{x}'")
            seen.add(x)

    unique([c.id for c in program.cohorts], "cohorts")
    unique([d.id for d in program.definitions], "definitions")
    criterion_ids: set[str] = set()
    for ci, cohort in enumerate(program.cohorts):
        unique([cr.id for cr in cohort.inclusion + cohort.exclusion], f"cohort '{cohort.id}' criteria")
        if not cohort.inclusion and not cohort.exclusion:
            problems.append(f"cohorts[{ci}] '{cohort.id}': no criteria")
        for side in ("inclusion", "exclusion"):
            for k, cr in enumerate(getattr(cohort, side)):
                criterion_ids.add(cr.id)
                check(cr.formula, f"cohorts[{ci}].{side}[{k}] '{cr.id}'")
    for k, d in enumerate(program.definitions):
        check(d.formula, f"definitions[{k}] '{d.id}'")
    for i, a in enumerate(program.atoms):
        for ref in a.source_criteria:
            if ref not in criterion_ids:
                problems.append(f"atoms[{i}] '{a.name}': source_criteria names unknown criterion '{ref}'")
    actual = program.compute_hash()
    if program.content_hash not in (None, actual):
        problems.append(
            f"content_hash: stored {program.content_hash} but the content hashes to {actual} "
            "(the program was edited after hashing; drop the field to re-hash)"
        )
    if problems:
        raise ProgramError(f"trial program '{program.trial_id}' is invalid", problems)
    return program.model_copy(update={"content_hash": actual})
