"""Import the paper authors' recorded formalizer outputs (``../shared/data/reference/v6``).

A file is ``{"inclusion": S, "exclusion": S}``; each side S has ``raw.smt_program_lines`` (SMT-LIB:
``declare-const``, zero-argument ``define-fun`` macros, and ``(assert (! EXPR :named NAME))``),
``raw.patient_var_values_rich`` (atom -> value / evidence / assessment / range) and ``sat_like``.

Mapping (lossless for everything the decision depends on):
- both sides' declarations become one atom table (a name declared on both sides is one chart fact;
  a sort clash is an error); macros are inlined;
- ``..._AUXILIARY...`` assertions become definitions (trial-wide), ``..._COMPONENT...`` assertions
  criteria of one cohort; exclusion assertions are stored un-negated (``(not X)`` -> criterion X,
  anything else -> ``not EXPR``), so the program means exactly what the two sides meant;
- values: a number/boolean is observed; a null with a ``range`` becomes bounds; a null without one
  stays unresolved. A value whose evidence starts with "silent" is not an observation but that
  pass's silence default (the authors' miner applied its own doctrine per side): it is imputed
  (the imputation record says so) only when every side whose criteria use the atom recorded that
  same default; otherwise the atom stays open, since a side's default must not decide the other
  side's criteria;
- ``__THRESH__::<atom>::<op>::<num>`` keys are threshold helpers the program does not declare.
  With a value they state a comparison the chart establishes: ``lt/le/gt/ge/eq`` ones become
  bounds (or a value) when the atom has no value or range of its own, and are checked against it
  when it has; ``ne`` ones are only checked; nulls are ignored. Helpers that contradict each other
  or the atom's own record are an extraction conflict (reported, the atom set aside), never dropped;
- the two sides' observed values are merged like two value-miner passes: an observation beats a
  null or a silence default, compatible records are intersected, incompatible ones (two different
  values, disjoint ranges) are an extraction conflict naming both passes and values; an observation
  only one pass recorded for an atom the other side's criteria also use is noted (one chart, one
  fact: it can decide the other side's criteria);
- ``(exists ((v S)) ...)`` in a definition (at a positive position: not under a negation, an
  equivalence or an ``ite`` condition) is skolemized: each bound variable becomes a fresh atom
  renamed apart, which keeps exactly the same set of patients. Any construct that cannot be
  imported soundly (a quantifier in a criterion, ``forall``, ``let``, ...) refuses the file with an
  ``UnsupportedConstructError`` naming the side, the assertion and the construct.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from .decision import ExtractionConflict
from .errors import ImportFormatError, UnsupportedConstructError, VerdictError, describe_validation_error
from .formula import (
    NEGATED_REL,
    And,
    Arith,
    Cmp,
    Const,
    Count,
    Iff,
    Implies,
    Not,
    Or,
    TermIte,
    atoms_in,
    render,
)
from .patient import Bounds, Imputation, MinedValue, PolicyRef, Resolution, ResolvedPatient
from .program import Atom, Cohort, Criterion, Definition, Provenance, TrialProgram, check_program

SIDES = ("inclusion", "exclusion")
RECORDED_POLICY = PolicyRef(name="recorded-value-miner", version="v6")


@dataclass
class ReferenceCase:
    program: TrialProgram
    patient: ResolvedPatient
    recorded_sat: dict[str, bool]  # side -> recorded sat_like
    notes: list[str]
    conflicts: list[ExtractionConflict] = field(default_factory=list)  # found while importing


def is_reference_format(data) -> bool:
    return (
        isinstance(data, dict)
        and set(SIDES) <= set(data)
        and all(isinstance(data[s], dict) and "raw" in data[s] for s in SIDES)
    )


def load_reference(path: str | Path) -> ReferenceCase:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ImportFormatError(f"{path.name}: not readable JSON: {e}") from None
    stem = path.name.split("__")[0]
    return import_reference(data, trial_id=stem, patient_id=path.parent.name or "patient", source=path.name)


@dataclass
class _Draft:
    """What a file's two sides add up to while it is imported: atoms, definitions, criteria, values."""

    cohort: Cohort
    sorts: dict[str, str] = field(default_factory=dict)
    skolems: dict[str, str] = field(default_factory=dict)  # fresh atom -> the definition it comes from
    definitions: list[Definition] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    passes: dict[str, dict[str, MinedValue]] = field(default_factory=dict)  # side -> atom -> its record
    conflicts: list[ExtractionConflict] = field(default_factory=list)
    extra: dict[str, dict] = field(default_factory=dict)  # atom -> its recorded assessment


def import_reference(data: dict, trial_id: str, patient_id: str, source: str = "") -> ReferenceCase:
    """One recorded file as a checked program and the patient's resolved values (module docstring)."""
    if not is_reference_format(data):
        raise ImportFormatError(
            f"{source or trial_id}: not the reference format (needs inclusion/exclusion with raw)"
        )
    where = source or trial_id
    draft = _Draft(cohort=Cohort(id="main", label=f"recorded formalization {trial_id}"))
    recorded = {}
    for side in SIDES:
        raw = data[side].get("raw") or {}
        recorded[side] = bool(data[side].get("sat_like"))
        _import_side(draft, side, raw, where)
    mentions = _mentions(draft.cohort)
    program = _checked_program(draft, trial_id, source, mentions, where)
    aside = {a for c in draft.conflicts for a in c.set_aside}
    merged, pass_conflicts, pass_notes, left_open = _merge_passes(
        draft.passes, program.atom_sides(), mentions, aside
    )
    draft.conflicts += pass_conflicts
    draft.notes += pass_notes
    aside |= {a for c in pass_conflicts for a in c.set_aside}
    resolutions = [
        _resolution(atom.name, merged.get(atom.name), draft.extra.get(atom.name, {}), aside, left_open)
        for atom in program.atoms
    ]
    patient = ResolvedPatient(
        patient_id=patient_id,
        trial_id=trial_id,
        program_hash=program.content_hash,
        policy=RECORDED_POLICY,
        resolutions=resolutions,
    )
    return ReferenceCase(
        program=program, patient=patient, recorded_sat=recorded, notes=draft.notes, conflicts=draft.conflicts
    )


def _import_side(draft: _Draft, side: str, raw, where: str) -> None:
    """One side's declarations, assertions and recorded values, added to the draft in that order."""
    shape = _shape_problems(raw)
    if shape:
        raise ImportFormatError(f"{where}: not the reference format", [f"{side}.raw.{p}" for p in shape])
    try:
        decls, macros, asserts = _parse_program(raw.get("smt_program_lines") or [])
    except _Unsupported as e:
        raise UnsupportedConstructError(
            f"{where}: cannot be imported soundly", [f"{side} side: {e}"]
        ) from None
    except (ValueError, IndexError, TypeError) as e:
        raise ImportFormatError(f"{where}: {side} side: cannot parse SMT program: {e}") from None
    _declare(draft.sorts, decls, side, where)
    for name, expr in asserts:
        _import_assertion(draft, side, name, expr, macros, where)
    side_values, side_extra, side_notes, side_conflicts = _values(
        raw.get("patient_var_values_rich") or {}, draft.sorts, side
    )
    draft.passes[side] = {mv.atom: mv for mv in side_values}
    draft.extra.update(side_extra)
    draft.notes += side_notes
    draft.conflicts += side_conflicts


def _declare(sorts: dict[str, str], decls: dict[str, str], side: str, where: str) -> None:
    """Add a side's declarations to the one atom table: Bool/Int/Real only, one sort per name."""
    for name, sort in decls.items():
        if sort not in ("Bool", "Int", "Real"):
            raise UnsupportedConstructError(
                f"{where}: cannot be imported soundly",
                [f"{side} side: atom '{name}' has sort {sort!r} (Bool/Int/Real only)"],
            )
        if sorts.setdefault(name, sort) != sort:
            raise ImportFormatError(
                f"{where}: atom '{name}' is {sorts[name]} on one side and {sort} on the other"
            )


def _import_assertion(draft: _Draft, side: str, name: str, expr, macros: dict, where: str) -> None:
    """One named assertion as a definition (AUXILIARY) or a criterion; what cannot be imported refuses
    the file, naming the side and the assertion."""
    cid = f"{'inc' if side == 'inclusion' else 'exc'}.{name}"
    try:
        if "AUXILIARY" in name:
            draft.definitions.append(_definition(draft, cid, name, expr, macros))
        else:
            getattr(draft.cohort, side).append(_criterion(draft.sorts, cid, side, name, expr, macros))
    except _Unsupported as e:
        raise UnsupportedConstructError(
            f"{where}: cannot be imported soundly", [f"{side} side, assertion {name}: {e}"]
        ) from None
    except (ValueError, IndexError, TypeError, KeyError, RecursionError) as e:
        raise ImportFormatError(
            f"{where}: cannot import an assertion", [f"{side} side, assertion {name}: {_short(e)}"]
        ) from None


def _definition(draft: _Draft, cid: str, name: str, expr, macros: dict) -> Definition:
    """A trial-wide definition; its existential variables become fresh atoms (skolems) of it."""
    conv = _Converter(draft.sorts, macros, skolem_prefix=cid)
    f = conv.formula(expr)
    for atom in conv.fresh:
        draft.skolems[atom] = cid
    link = "QUAL_IMPLIES_STEM" in name or _is_qualifier_link(f)
    kind = "qualifier_implies_stem" if link else "definition"
    return Definition(id=cid, kind=kind, formula=f, text=render(f))


def _criterion(sorts: dict[str, str], cid: str, side: str, name: str, expr, macros: dict) -> Criterion:
    """A criterion of the one cohort; an exclusion is stored un-negated, so it means what the side meant."""
    conv = _Converter(sorts, macros)
    if side == "exclusion":
        f = (
            conv.formula(expr[1])
            if isinstance(expr, list) and expr[0] == "not" and len(expr) == 2
            else Not(op="not", arg=conv.formula(expr))
        )
    else:
        f = conv.formula(expr)
    return Criterion(id=cid, text=f"[recorded {side} component {name}] " + render(f), formula=f)


def _mentions(cohort: Cohort) -> dict[str, list[str]]:
    """Atom -> the criteria (inclusion first) whose formulas use it."""
    mentions: dict[str, list[str]] = {}
    for side in SIDES:
        for cr in getattr(cohort, side):
            for name in atoms_in(cr.formula):
                mentions.setdefault(name, []).append(cr.id)
    return mentions


def _checked_program(
    draft: _Draft, trial_id: str, source: str, mentions: dict[str, list[str]], where: str
) -> TrialProgram:
    """The draft's atoms, definitions and cohort as one program, checked as any program is."""
    atoms = [
        _atom(name, sort, mentions.get(name, []), skolem_of=draft.skolems.get(name))
        for name, sort in draft.sorts.items()
    ]
    program = TrialProgram(
        trial_id=trial_id,
        title=f"recorded formalization of {trial_id}",
        atoms=atoms,
        definitions=draft.definitions,
        cohorts=[draft.cohort],
        provenance=Provenance(
            source="reference-import",
            details={
                "file": source,
                # said once here rather than per atom: a per-atom prefix is tokens every training target pays
                "atom_definitions": (
                    "the recorded atom names spelled out (the recorded outputs carry no definitions)"
                ),
            },
        ),
    )
    try:
        return check_program(program)
    except VerdictError as e:
        raise ImportFormatError(f"{where}: imported program is invalid", e.problems or [e.summary]) from None


def _resolution(
    name: str, mv: MinedValue | None, info: dict, aside: set[str], left_open: dict[str, str]
) -> Resolution:
    """An atom's resolution: set aside (conflict), left open (sides differ), unresolved, imputed
    (a silence default both sides share) or observed."""
    note = info.get("assessment") or None
    if name in aside:
        return Resolution(
            atom=name,
            status="unresolved",
            note="set aside: the recorded values contradict each other (extraction conflict)",
        )
    if name in left_open:
        return Resolution(atom=name, status="unresolved", note=left_open[name])
    if mv is None or (mv.value is None and mv.bounds is None):
        return Resolution(atom=name, status="unresolved", note=note)
    if _is_silence(mv):
        imp = Imputation(
            policy=RECORDED_POLICY.name,
            policy_version=RECORDED_POLICY.version,
            rule="miner-silence-default",
            reason=info.get("assessment") or mv.evidence,
        )
        return Resolution(
            atom=name,
            status="imputed",
            value=mv.value,
            bounds=mv.bounds,
            imputation=imp,
            note=mv.evidence or None,
        )
    return Resolution(
        atom=name,
        status="observed",
        value=mv.value,
        bounds=mv.bounds,
        evidence=mv.evidence or info.get("assessment") or "(recorded value)",
        note=note,
    )


def _shape_problems(raw) -> list[str]:
    if not isinstance(raw, dict):
        return ["must be an object"]
    problems = []
    lines = raw.get("smt_program_lines") or []
    if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
        problems.append("smt_program_lines: must be a list of strings")
    if not isinstance(raw.get("patient_var_values_rich") or {}, dict):
        problems.append("patient_var_values_rich: must be an object")
    return problems


def _short(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "nested too deeply to import"
    if isinstance(e, ValidationError):  # e.g. a formula past the nesting bound: say which rule
        return "; ".join(describe_validation_error(e, "assertion")[:3])
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text[:300]


# ---- values -----------------------------------------------------------------------------------
def _record_text(mv: MinedValue) -> str:
    if mv.bounds is not None:
        return mv.bounds.text(mv.atom)
    return f"{mv.atom} = {json.dumps(mv.value)}"


def _value_text(mv: MinedValue) -> str:
    return mv.bounds.text(mv.atom) if mv.bounds is not None else json.dumps(mv.value)


def meet(a: MinedValue, b: MinedValue) -> MinedValue | None:
    """The record both say (value within range, range intersection), or None if none can hold."""
    if a.value is not None and b.value is not None:
        return a if a.value == b.value and isinstance(a.value, bool) == isinstance(b.value, bool) else None
    if a.value is not None or b.value is not None:
        v, r = (a, b) if a.value is not None else (b, a)
        return (
            v
            if isinstance(v.value, (int, float))
            and not isinstance(v.value, bool)
            and r.bounds.contains(v.value)
            else None
        )
    lo, lo_s = max(
        (a.bounds.lo, a.bounds.lo_strict),
        (b.bounds.lo, b.bounds.lo_strict),
        key=lambda t: (float("-inf") if t[0] is None else t[0], t[1]),
    )
    hi, hi_s = min(
        (a.bounds.hi, a.bounds.hi_strict),
        (b.bounds.hi, b.bounds.hi_strict),
        key=lambda t: (float("inf") if t[0] is None else t[0], not t[1]),
    )
    try:
        return MinedValue(
            atom=a.atom,
            value=None,
            evidence=a.evidence or b.evidence,
            bounds=Bounds(lo=lo, hi=hi, lo_strict=lo_s, hi_strict=hi_s),
        )
    except ValueError:
        return None


def _is_silence(mv: MinedValue) -> bool:
    """A recorded value whose own evidence marks it as the pass's silence default, not an observation."""
    return (mv.evidence or "").strip().lower().startswith("silent")


def _merge_passes(
    passes: dict[str, dict[str, MinedValue]],
    sides: dict[str, set[str]],
    mentions: dict[str, list[str]],
    aside: set[str],
):
    """One record per atom from the inclusion and exclusion passes (see the module docstring).

    Observed values are one chart fact. A silence default is its side's policy default: it is kept
    (imputed) only if every side that uses the atom (``sides``: through definitions too, as a policy
    sees it) recorded the same default; otherwise the atom is returned in ``left_open`` (atom -> why),
    as a policy leaves an atom open whose sides disagree."""
    merged: dict[str, MinedValue] = {}
    conflicts: list[ExtractionConflict] = []
    notes: list[str] = []
    left_open: dict[str, str] = {}
    names = list(dict.fromkeys(a for side in SIDES for a in passes.get(side, {})))
    for atom in names:
        if atom in aside:
            continue
        recs = {
            side: mv
            for side in SIDES
            if (mv := passes.get(side, {}).get(atom)) is not None
            and (mv.value is not None or mv.bounds is not None)
        }
        observed = {side: mv for side, mv in recs.items() if not _is_silence(mv)}
        defaults = {side: mv for side, mv in recs.items() if _is_silence(mv)}
        if not recs:
            merged[atom] = MinedValue(atom=atom, value=None)
        elif len(observed) == 1:
            ((side, mv),) = observed.items()
            merged[atom] = mv
            other = "exclusion" if side == "inclusion" else "inclusion"
            if any(c.startswith(other[:3] + ".") for c in mentions.get(atom, [])):
                left = "recorded only its silence default" if other in defaults else "left it open"
                notes.append(
                    f"{atom}: {_record_text(mv)} was recorded by the {side} pass only (the {other} pass "
                    f"{left}); it is one chart fact, so it also decides {other} criteria"
                )
        elif observed:
            both = meet(observed["inclusion"], observed["exclusion"])
            if both is None:
                conflicts.append(
                    ExtractionConflict(
                        atoms=[atom],
                        definitions=[],
                        set_aside=[atom],
                        source="passes",
                        values=[f"{side} pass: {_record_text(mv)}" for side, mv in observed.items()],
                    )
                )
            else:
                merged[atom] = both
        else:
            users = [side for side in SIDES if side in (sides.get(atom) or defaults)]
            views = {
                side: f"silence default {_value_text(defaults[side])}" if side in defaults else "left open"
                for side in users
            }
            if len(set(views.values())) == 1 and all(side in defaults for side in users):
                merged[atom] = defaults[users[0]]
            else:
                detail = "; ".join(f"{side} pass: {view}" for side, view in views.items())
                left_open[atom] = (
                    f"left open: a recorded silence default is its side's policy default, not a chart "
                    f"fact, and the sides that use this atom differ ({detail})"
                )
                notes.append(f"{atom}: {left_open[atom]}")
    return merged, conflicts, notes, left_open


def _values(rich: dict, sorts: dict[str, str], side: str):
    values: list[MinedValue] = []
    info: dict[str, dict] = {}
    notes: list[str] = []
    conflicts: list[ExtractionConflict] = []
    thresh: dict[str, list] = {}
    for key, v in rich.items():
        if not isinstance(v, dict):
            continue
        if key.startswith("__THRESH__::"):
            parts = key.split("::")
            if len(parts) == 4 and v.get("value") is not None:
                thresh.setdefault(parts[1], []).append(
                    (parts[2], parts[3], v.get("value"), v.get("evidence") or "")
                )
            continue
        if key not in sorts:
            notes.append(f"value for undeclared atom '{key}' ignored")
            continue
        info[key] = {"assessment": v.get("assessment")}
        value, bounds = v.get("value"), None
        if sorts[key] != "Bool" and value is None:
            bounds = _bounds(v.get("range"))
        if sorts[key] == "Bool" and value is not None and not isinstance(value, bool):
            notes.append(f"'{key}': non-boolean value {value!r} for a Bool atom ignored")
            value = None
        if (
            sorts[key] != "Bool"
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, (int, float)))
        ):
            notes.append(f"'{key}': non-numeric value {value!r} for a numeric atom ignored")
            value = None
        if sorts[key] == "Int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        values.append(MinedValue(atom=key, value=value, bounds=bounds, evidence=v.get("evidence") or ""))
    have = {mv.atom: mv for mv in values}
    for atom, comps in thresh.items():
        if sorts.get(atom) not in ("Int", "Real"):
            notes.append(f"threshold helpers for '{atom}' ignored: not a declared numeric atom")
            continue
        own = have.get(atom)
        if own is not None and own.value is None and own.bounds is None:
            own = None
        found = _threshold_record(atom, comps, own, sorts[atom], side)
        if isinstance(found, ExtractionConflict):
            conflicts.append(found)
            values = [x for x in values if x.atom != atom]
        elif found is not None and own is None:
            values = [x for x in values if x.atom != atom] + [found]
    return values, info, notes, conflicts


def _threshold_record(atom: str, comps: list, own: MinedValue | None, sort: str, side: str):
    """What a set of threshold helpers of one atom establishes: a record (bounds, or a value for a
    true ``eq``), None if nothing an interval can hold, or an ExtractionConflict when the helpers
    contradict each other or the atom's own value/range."""
    iv = {"lo": None, "hi": None, "lo_strict": False, "hi_strict": False}
    holes: list[float] = []
    shown = [
        f"{side} pass: __THRESH__::{atom}::{op}::{num} = {json.dumps(holds)}" for op, num, holds, _ in comps
    ]
    for op, num, holds, _ in comps:
        try:
            x = float(num)
        except ValueError:
            continue
        rel = op if holds is True else NEGATED_REL.get(op) if holds is False else None
        if rel in ("gt", "ge", "eq") and (
            iv["lo"] is None or x > iv["lo"] or (x == iv["lo"] and rel == "gt")
        ):
            iv["lo"], iv["lo_strict"] = x, rel == "gt"
        if rel in ("lt", "le", "eq") and (
            iv["hi"] is None or x < iv["hi"] or (x == iv["hi"] and rel == "lt")
        ):
            iv["hi"], iv["hi_strict"] = x, rel == "lt"
        if rel == "ne":
            holes.append(x)
    record = None
    empty = False
    if iv["lo"] is not None or iv["hi"] is not None:
        try:
            b = Bounds(**iv)
        except ValueError:
            empty = True
        else:
            point = b.lo is not None and b.lo == b.hi
            empty = point and b.lo in holes
            if point:
                value = int(b.lo) if sort == "Int" and float(b.lo).is_integer() else float(b.lo)
                record = MinedValue(atom=atom, value=value, evidence=comps[0][3])
            else:
                record = MinedValue(atom=atom, value=None, bounds=b, evidence=comps[0][3])
    if not empty and own is not None:
        if own.value is not None and (
            own.value in holes or (record is not None and meet(own, record) is None)
        ):
            empty = True
        elif own.value is None and record is not None and meet(own, record) is None:
            empty = True
        if empty:
            shown.append(f"{side} pass: {_record_text(own)}")
    if empty:
        return ExtractionConflict(
            atoms=[atom], definitions=[], set_aside=[atom], source="threshold_helpers", values=shown
        )
    return record


def _bounds(r) -> Bounds | None:
    if not isinstance(r, dict) or (r.get("min") is None and r.get("max") is None):
        return None
    try:
        return Bounds(
            lo=r.get("min"),
            hi=r.get("max"),
            lo_strict=bool(r.get("min_strict")),
            hi_strict=bool(r.get("max_strict")),
        )
    except ValueError:
        return None


# ---- atoms ------------------------------------------------------------------------------------
_KIND_PATTERNS = [
    ("demographic", r"(^|_)(age|sex|gender|female|male|pregnan|weight|height|bmi|body_mass)"),
    (
        "medication",
        r"(medication|drug|therapy|treated_with|receiv|taking|dose|administration|prednisone|steroid|insulin|heparin)",
    ),
    (
        "procedure",
        r"(undergone|procedure|surgery|transplant|implant|biopsy|catheter|dialysis|ventilat|intubat)",
    ),
    (
        "lab_value",
        r"(measurement|_value_|level|count|concentration|clearance|score|ratio|percent|_ml_|_mg_|_g_per)",
    ),
    ("timing", r"(duration|time_since|since_|within|_weeks|_months|_hours|_days|datetime)"),
    ("diagnosis", r"(diagnosis|finding|disease|disorder|syndrome|history_of|has_)"),
]


def _atom(name: str, sort: str, sources: list[str], skolem_of: str | None = None) -> Atom:
    domain = {"Bool": "bool", "Int": "int", "Real": "real"}[sort]
    if skolem_of is not None:
        return Atom(
            name=name,
            domain=domain,
            kind="other",
            source_criteria=sources,
            definition=f"(fresh constant) a witness of the existential in definition {skolem_of}; "
            "not a chart fact",
        )
    low = name.lower()
    kind = next((k for k, pat in _KIND_PATTERNS if re.search(pat, low)), "other")
    if domain == "bool" and kind == "lab_value":
        kind = "diagnosis"
    unit = None
    if domain != "bool":
        m = re.search(r"withunit_([a-z0-9_]+)$", low) or re.search(
            r"_in_(years|months|weeks|days|hours|minutes)\b", low
        )
        unit = m.group(1) if m else None
    stem, _, qualifier = name.partition("@@")
    words = stem.replace("_", " ").replace("inthehistory", "in the history").strip()
    definition = f"{words}" + (f", qualified as: {qualifier.replace('_', ' ')}" if qualifier else "")
    return Atom(
        name=name, domain=domain, kind=kind, unit=unit, definition=definition, source_criteria=sources
    )


def _is_qualifier_link(f) -> bool:
    return (
        isinstance(f, Implies)
        and isinstance(f.if_, str)
        and isinstance(f.then, str)
        and f.if_.startswith(f.then + "@@")
    )


# ---- SMT-LIB subset ---------------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(\()|(\))|(\|[^|]*\|)|([^\s()]+))")


def _sexprs(text: str):
    pos, stack, out = 0, [[]], None
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        if m.group(1):
            stack.append([])
        elif m.group(2):
            done = stack.pop()
            stack[-1].append(done)
        else:
            tok = m.group(3) or m.group(4)
            stack[-1].append(tok.strip("|"))
    if len(stack) != 1:
        raise ValueError("unbalanced parentheses")
    out = stack[0]
    return out


def _parse_program(lines: list[str]):
    decls: dict[str, str] = {}
    macros: dict[str, tuple[str, object]] = {}
    asserts: list[tuple[str, object]] = []
    text = "\n".join(line for line in lines if not line.lstrip().startswith(";"))
    for form in _sexprs(text):
        if not isinstance(form, list) or not form:
            continue
        head = form[0]
        if head == "declare-const":
            decls[form[1]] = form[2]
        elif head == "declare-fun":
            if form[2] != []:
                raise _Unsupported(f"declare-fun {form[1]} with arguments (an uninterpreted function)")
            decls[form[1]] = form[3]
        elif head == "define-fun":
            if form[2] != []:
                raise _Unsupported(f"define-fun {form[1]} with arguments")
            macros[form[1]] = (form[3], form[4])
        elif head == "assert":
            body = form[1]
            if isinstance(body, list) and body and body[0] == "!":
                name = body[body.index(":named") + 1] if ":named" in body else f"ASSERT{len(asserts)}"
                asserts.append((name, body[1]))
            else:
                asserts.append((f"ASSERT{len(asserts)}", body))
    return decls, macros, asserts


_RELS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
_QUANTIFIERS = ("exists", "forall")


class _Unsupported(ValueError):
    """A construct the importer cannot translate without changing its meaning."""


class _Converter:
    """SMT-LIB s-expressions -> formula AST. ``skolem_prefix`` (definitions only) allows existentials
    at positive positions: each bound variable becomes a fresh atom (listed in ``fresh``)."""

    def __init__(
        self, sorts: dict[str, str], macros: dict[str, tuple[str, object]], skolem_prefix: str | None = None
    ):
        self.sorts, self.macros = sorts, macros
        self.skolem_prefix = skolem_prefix
        self.bound: dict[str, str] = {}  # bound variable -> its fresh atom, in scope
        self.fresh: list[str] = []

    def _sym(self, e: str) -> str:
        return self.bound.get(e, e)

    def sort(self, e) -> str:
        if isinstance(e, str):
            e = self._sym(e)
            if e in ("true", "false"):
                return "Bool"
            if e in self.sorts:
                return self.sorts[e]
            if e in self.macros:
                return self.macros[e][0]
            if _is_num(e):
                return "Real" if "." in e else "Int"
            raise ValueError(f"unknown symbol '{e}'")
        head = e[0]
        if head in ("and", "or", "not", "=>", "=", "<", "<=", ">", ">=", "distinct", "xor") + _QUANTIFIERS:
            return "Bool"
        if head == "ite":
            return self.sort(e[2])
        return "Real"

    def formula(self, e, pol: int = 1):
        """pol: +1 positive, -1 negative, 0 both (under iff, =, xor, an ite condition, a count)."""
        if isinstance(e, str):
            e = self._sym(e)
            if e in ("true", "false"):
                return Const(op="const", value=e == "true")
            if e in self.macros:
                return self.formula(self.macros[e][1], pol)
            if self.sorts.get(e) != "Bool":
                raise ValueError(f"'{e}' used as a condition but is not Bool")
            return e
        if not e:
            raise ValueError("empty expression ()")
        head, args = e[0], e[1:]
        if isinstance(head, list):
            raise _Unsupported("an applied expression in operator position")
        if head in _QUANTIFIERS:
            return self._quantifier(head, args, pol)
        if head == "not":
            return Not(op="not", arg=self.formula(args[0], -pol))
        if head in ("and", "or"):
            if not args:
                return Const(op="const", value=head == "and")
            cls = And if head == "and" else Or
            return cls(op=head, args=[self.formula(a, pol) for a in args])
        if head == "=>":
            if len(args) != 2:
                raise ValueError(f"'=>' with {len(args)} arguments")
            return Implies(
                op="implies", **{"if": self.formula(args[0], -pol), "then": self.formula(args[1], pol)}
            )
        if head in ("=", "distinct"):
            if len(args) != 2:
                raise ValueError(f"'{head}' with {len(args)} arguments")
            if self.sort(args[0]) == "Bool":
                f = Iff(op="iff", args=[self.formula(args[0], 0), self.formula(args[1], 0)])
                return f if head == "=" else Not(op="not", arg=f)
            return Cmp(
                op="cmp", lhs=self.term(args[0]), rel="eq" if head == "=" else "ne", rhs=self.term(args[1])
            )
        if head in _RELS:
            if len(args) != 2:
                raise ValueError(f"chained comparison {head} with {len(args)} arguments")
            return Cmp(op="cmp", lhs=self.term(args[0]), rel=_RELS[head], rhs=self.term(args[1]))
        if head == "ite":
            c = self.formula(args[0], 0)
            a, b = self.formula(args[1], pol), self.formula(args[2], pol)
            return Or(
                op="or", args=[And(op="and", args=[c, a]), And(op="and", args=[Not(op="not", arg=c), b])]
            )
        if head == "xor":
            return Not(op="not", arg=Iff(op="iff", args=[self.formula(args[0], 0), self.formula(args[1], 0)]))
        raise _Unsupported(f"operator '{head}'")

    def _quantifier(self, head: str, args, pol: int):
        # (exists ((v S) ...) body) at a positive position (or forall at a negative one) of a
        # definition says "some v": a fresh constant per variable keeps the same set of patients.
        existential = (head == "exists" and pol == 1) or (head == "forall" and pol == -1)
        if self.skolem_prefix is None or not existential:
            where = (
                "a criterion"
                if self.skolem_prefix is None
                else "a position where it is not an existential (under a negation, an equivalence or an ite "
                "condition)"
            )
            raise _Unsupported(f"'{head}' quantifier in {where}")
        if len(args) != 2 or not isinstance(args[0], list) or not args[0]:
            raise ValueError(f"malformed '{head}'")
        saved = dict(self.bound)
        for binding in args[0]:
            if not (
                isinstance(binding, list)
                and len(binding) == 2
                and isinstance(binding[0], str)
                and binding[1] in ("Bool", "Int", "Real")
            ):
                raise _Unsupported(f"'{head}' binding {binding!r} (a variable of sort Bool, Int or Real)")
            var, sort = binding
            base = "skolem::" + self.skolem_prefix[:180] + "::" + re.sub(r"[^A-Za-z0-9_]", "_", var)[:40]
            name, i = base, 1
            while name in self.sorts or name in self.macros:
                i += 1
                name = f"{base}.{i}"
            self.sorts[name] = sort
            self.fresh.append(name)
            self.bound[var] = name
        try:
            body = self.formula(args[1], pol)
        finally:
            self.bound = saved
        return body

    def term(self, e):
        if isinstance(e, str):
            e = self._sym(e)
            if _is_num(e):
                x = float(e)
                return int(x) if "." not in e and x.is_integer() else x
            if e in self.macros:
                return self.term(self.macros[e][1])
            if self.sorts.get(e) not in ("Int", "Real"):
                raise ValueError(f"'{e}' used as a number but is not Int/Real")
            return e
        if not e:
            raise ValueError("empty expression ()")
        head, args = e[0], e[1:]
        if head == "-" and len(args) == 1:
            inner = self.term(args[0])
            return -inner if isinstance(inner, (int, float)) else Arith(op="sub", args=[0, inner])
        if head in ("+", "-", "*", "/"):
            if head == "+" and all(_is_count_item(a) for a in args):
                return Count(op="count", args=[self.formula(a[1], 0) for a in args])
            op = {"+": "add", "-": "sub", "*": "mul", "/": "div"}[head]
            terms = [self.term(a) for a in args]
            if len(terms) < 2:
                raise ValueError(f"'{head}' with {len(terms)} argument(s)")
            if op in ("sub", "div") and len(terms) > 2:
                out = terms[0]
                for t in terms[1:]:
                    out = Arith(op=op, args=[out, t])
                return out
            return Arith(op=op, args=terms)
        if head == "ite":
            return TermIte(
                op="ite",
                **{"if": self.formula(args[0], 0), "then": self.term(args[1]), "else": self.term(args[2])},
            )
        if head == "to_real":
            return self.term(args[0])
        raise _Unsupported(f"numeric operator '{head}'")


def _is_num(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _is_count_item(a) -> bool:
    return isinstance(a, list) and len(a) == 4 and a[0] == "ite" and a[2] == "1" and a[3] == "0"
