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
- values: a number/boolean is observed, or imputed when its evidence starts with "silent" (the
  authors' miner applied its own silence doctrine: the imputation record says so); a null with a
  ``range`` becomes bounds; a null without one stays unresolved;
- ``__THRESH__::<atom>::<op>::<num>`` keys are threshold helpers the program does not declare.
  With a value they state a comparison the chart establishes; ``lt/le/gt/ge`` ones become bounds
  when the atom has no value or range of its own, ``eq`` ones (4 in the shipped files) are dropped
  and noted, nulls are ignored;
- the two sides' values are merged like two value-miner passes (a value beats a null; two
  different values leave the atom unresolved, with a note).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ImportFormatError, VerdictError
from .formula import And, Arith, Cmp, Const, Count, Iff, Implies, Not, Or, TermIte, atoms_in, render
from .patient import Bounds, Imputation, MinedValue, PolicyRef, Resolution, ResolvedPatient
from .policy import merge_passes
from .program import Atom, Cohort, Criterion, Definition, Provenance, TrialProgram, check_program

SIDES = ("inclusion", "exclusion")
RECORDED_POLICY = PolicyRef(name="recorded-value-miner", version="v6")


@dataclass
class ReferenceCase:
    program: TrialProgram
    patient: ResolvedPatient
    recorded_sat: dict[str, bool]  # side -> recorded sat_like
    notes: list[str]


def is_reference_format(data) -> bool:
    return isinstance(data, dict) and set(SIDES) <= set(data) and all(
        isinstance(data[s], dict) and "raw" in data[s] for s in SIDES
    )


def load_reference(path: str | Path) -> ReferenceCase:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ImportFormatError(f"{path.name}: not readable JSON: {e}") from None
    stem = path.name.split("__")[0]
    return import_reference(data, trial_id=stem, patient_id=path.parent.name or "patient", source=path.name)


def import_reference(data: dict, trial_id: str, patient_id: str, source: str = "") -> ReferenceCase:
    if not is_reference_format(data):
        raise ImportFormatError(f"{source or trial_id}: not the reference format (needs inclusion/exclusion with raw)")
    sorts: dict[str, str] = {}
    definitions: list[Definition] = []
    cohort = Cohort(id="main", label=f"recorded formalization {trial_id}")
    notes: list[str] = []
    passes: list[list[MinedValue]] = []
    extra: dict[str, dict] = {}
    recorded = {}
    for side in SIDES:
        raw = data[side].get("raw") or {}
        recorded[side] = bool(data[side].get("sat_like"))
        try:
            decls, macros, asserts = _parse_program(raw.get("smt_program_lines") or [])
        except (ValueError, IndexError) as e:
            raise ImportFormatError(f"{source}: {side} side: cannot parse SMT program: {e}") from None
        for name, sort in decls.items():
            if sorts.setdefault(name, sort) != sort:
                raise ImportFormatError(f"{source}: atom '{name}' is {sorts[name]} on one side and {sort} on the other")
        conv = _Converter({**sorts}, macros)
        prefix = "inc" if side == "inclusion" else "exc"
        for name, expr in asserts:
            cid = f"{prefix}.{name}"
            if "AUXILIARY" in name:
                f = conv.formula(expr)
                kind = "qualifier_implies_stem" if "QUAL_IMPLIES_STEM" in name or _is_qualifier_link(f) else "definition"
                definitions.append(Definition(id=cid, kind=kind, formula=f, text=render(f)))
            else:
                if side == "exclusion":
                    f = conv.formula(expr[1]) if isinstance(expr, list) and expr[0] == "not" and len(expr) == 2 \
                        else Not(op="not", arg=conv.formula(expr))
                else:
                    f = conv.formula(expr)
                text = f"[recorded {side} component {name}] " + render(f)
                getattr(cohort, side).append(Criterion(id=cid, text=text, formula=f))
        side_values, side_extra, side_notes = _values(raw.get("patient_var_values_rich") or {}, sorts)
        passes.append(side_values)
        extra.update(side_extra)
        notes += side_notes
    mentions: dict[str, list[str]] = {}
    for side in SIDES:
        for cr in getattr(cohort, side):
            for name in atoms_in(cr.formula):
                mentions.setdefault(name, []).append(cr.id)
    atoms = [_atom(name, sort, mentions.get(name, [])) for name, sort in sorts.items()]
    program = TrialProgram(
        trial_id=trial_id, title=f"recorded formalization of {trial_id}", atoms=atoms, definitions=definitions,
        cohorts=[cohort], provenance=Provenance(source="reference-import", details={"file": source}),
    )
    try:
        program = check_program(program)
    except VerdictError as e:
        raise ImportFormatError(f"{source}: imported program is invalid: {e}") from None
    merged, disagreements = merge_passes(*passes)
    resolutions = []
    for atom in program.atoms:
        mv = merged.get(atom.name)
        info = extra.get(atom.name, {})
        note = "; ".join(x for x in (info.get("assessment"), disagreements.get(atom.name)) if x) or None
        if mv is None or (mv.value is None and mv.bounds is None):
            resolutions.append(Resolution(atom=atom.name, status="unresolved", note=note))
            continue
        silent = (mv.evidence or "").strip().lower().startswith("silent")
        if silent:
            imp = Imputation(policy=RECORDED_POLICY.name, policy_version=RECORDED_POLICY.version,
                             rule="miner-silence-default", reason=info.get("assessment") or mv.evidence)
            resolutions.append(Resolution(atom=atom.name, status="imputed", value=mv.value, bounds=mv.bounds,
                                          imputation=imp, note=mv.evidence or None))
        else:
            resolutions.append(Resolution(atom=atom.name, status="observed", value=mv.value, bounds=mv.bounds,
                                          evidence=mv.evidence or info.get("assessment") or "(recorded value)", note=note))
    notes += [f"{a}: {why}" for a, why in disagreements.items()]
    patient = ResolvedPatient(patient_id=patient_id, trial_id=trial_id, program_hash=program.content_hash,
                              policy=RECORDED_POLICY, resolutions=resolutions)
    return ReferenceCase(program=program, patient=patient, recorded_sat=recorded, notes=notes)


# ---- values -----------------------------------------------------------------------------------
def _values(rich: dict, sorts: dict[str, str]):
    values: list[MinedValue] = []
    info: dict[str, dict] = {}
    notes: list[str] = []
    thresh: dict[str, list] = {}
    for key, v in rich.items():
        if not isinstance(v, dict):
            continue
        if key.startswith("__THRESH__::"):
            parts = key.split("::")
            if len(parts) == 4 and v.get("value") is not None:
                thresh.setdefault(parts[1], []).append((parts[2], parts[3], v.get("value"), v.get("evidence") or ""))
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
        if sorts[key] != "Bool" and isinstance(value, bool):
            notes.append(f"'{key}': boolean value for a numeric atom ignored")
            value = None
        if sorts[key] == "Int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        values.append(MinedValue(atom=key, value=value, bounds=bounds, evidence=v.get("evidence") or ""))
    have = {mv.atom: mv for mv in values}
    for atom, comps in thresh.items():
        mv = have.get(atom)
        if atom not in sorts or (mv is not None and (mv.value is not None or mv.bounds is not None)):
            continue
        lo = hi = None
        lo_s = hi_s = False
        evidence = comps[0][3]
        for op, num, holds, _ in comps:
            rel = op if holds else {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}.get(op)
            x = float(num)
            if rel in ("gt", "ge") and (lo is None or x > lo):
                lo, lo_s = x, rel == "gt"
            elif rel in ("lt", "le") and (hi is None or x < hi):
                hi, hi_s = x, rel == "lt"
            elif rel in ("eq", "ne"):
                notes.append(f"threshold helper '{atom} {rel} {num}' is not an interval; dropped")
        if lo is not None or hi is not None:
            try:
                b = Bounds(lo=lo, hi=hi, lo_strict=lo_s, hi_strict=hi_s)
            except ValueError:
                notes.append(f"threshold helpers for '{atom}' are contradictory; dropped")
                continue
            values = [x for x in values if x.atom != atom] + [MinedValue(atom=atom, value=None, bounds=b, evidence=evidence)]
    return values, info, notes


def _bounds(r) -> Bounds | None:
    if not isinstance(r, dict) or (r.get("min") is None and r.get("max") is None):
        return None
    try:
        return Bounds(lo=r.get("min"), hi=r.get("max"), lo_strict=bool(r.get("min_strict")),
                      hi_strict=bool(r.get("max_strict")))
    except ValueError:
        return None


# ---- atoms ------------------------------------------------------------------------------------
_KIND_PATTERNS = [
    ("demographic", r"(^|_)(age|sex|gender|female|male|pregnan|weight|height|bmi|body_mass)"),
    ("medication", r"(medication|drug|therapy|treated_with|receiv|taking|dose|administration|prednisone|steroid|insulin|heparin)"),
    ("procedure", r"(undergone|procedure|surgery|transplant|implant|biopsy|catheter|dialysis|ventilat|intubat)"),
    ("lab_value", r"(measurement|_value_|level|count|concentration|clearance|score|ratio|percent|_ml_|_mg_|_g_per)"),
    ("timing", r"(duration|time_since|since_|within|_weeks|_months|_hours|_days|datetime)"),
    ("diagnosis", r"(diagnosis|finding|disease|disorder|syndrome|history_of|has_)"),
]


def _atom(name: str, sort: str, sources: list[str]) -> Atom:
    domain = {"Bool": "bool", "Int": "int", "Real": "real"}[sort]
    low = name.lower()
    kind = next((k for k, pat in _KIND_PATTERNS if re.search(pat, low)), "other")
    if domain == "bool" and kind == "lab_value":
        kind = "diagnosis"
    unit = None
    if domain != "bool":
        m = re.search(r"withunit_([a-z0-9_]+)$", low) or re.search(r"_in_(years|months|weeks|days|hours|minutes)\b", low)
        unit = m.group(1) if m else None
    stem, _, qualifier = name.partition("@@")
    words = stem.replace("_", " ").replace("inthehistory", "in the history").strip()
    definition = f"{words}" + (f", qualified as: {qualifier.replace('_', ' ')}" if qualifier else "")
    return Atom(name=name, domain=domain, kind=kind, unit=unit,
                definition=f"(recorded atom) {definition}", source_criteria=sources)


def _is_qualifier_link(f) -> bool:
    return isinstance(f, Implies) and isinstance(f.if_, str) and isinstance(f.then, str) and f.if_.startswith(f.then + "@@")


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
        elif head == "declare-fun" and form[2] == []:
            decls[form[1]] = form[3]
        elif head == "define-fun":
            if form[2] != []:
                raise ValueError(f"define-fun {form[1]} with arguments is not supported")
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


class _Converter:
    def __init__(self, sorts: dict[str, str], macros: dict[str, tuple[str, object]]):
        self.sorts, self.macros = sorts, macros

    def sort(self, e) -> str:
        if isinstance(e, str):
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
        if head in ("and", "or", "not", "=>", "=", "<", "<=", ">", ">=", "distinct", "xor"):
            return "Bool"
        if head == "ite":
            return self.sort(e[2])
        return "Real"

    def formula(self, e):
        if isinstance(e, str):
            if e in ("true", "false"):
                return Const(op="const", value=e == "true")
            if e in self.macros:
                return self.formula(self.macros[e][1])
            if self.sorts.get(e) != "Bool":
                raise ValueError(f"'{e}' used as a condition but is not Bool")
            return e
        head, args = e[0], e[1:]
        if head == "not":
            return Not(op="not", arg=self.formula(args[0]))
        if head in ("and", "or"):
            if not args:
                return Const(op="const", value=head == "and")
            cls = And if head == "and" else Or
            return cls(op=head, args=[self.formula(a) for a in args])
        if head == "=>":
            return Implies(op="implies", **{"if": self.formula(args[0]), "then": self.formula(args[1])})
        if head in ("=", "distinct"):
            if self.sort(args[0]) == "Bool":
                f = Iff(op="iff", args=[self.formula(args[0]), self.formula(args[1])])
                return f if head == "=" else Not(op="not", arg=f)
            return Cmp(op="cmp", lhs=self.term(args[0]), rel="eq" if head == "=" else "ne", rhs=self.term(args[1]))
        if head in _RELS:
            if len(args) != 2:
                raise ValueError(f"chained comparison {head} with {len(args)} arguments")
            return Cmp(op="cmp", lhs=self.term(args[0]), rel=_RELS[head], rhs=self.term(args[1]))
        if head == "ite":
            c, a, b = (self.formula(x) for x in args)
            return Or(op="or", args=[And(op="and", args=[c, a]), And(op="and", args=[Not(op="not", arg=c), b])])
        if head == "xor":
            return Not(op="not", arg=Iff(op="iff", args=[self.formula(args[0]), self.formula(args[1])]))
        raise ValueError(f"unsupported operator '{head}'")

    def term(self, e):
        if isinstance(e, str):
            if _is_num(e):
                x = float(e)
                return int(x) if "." not in e and x.is_integer() else x
            if e in self.macros:
                return self.term(self.macros[e][1])
            if self.sorts.get(e) not in ("Int", "Real"):
                raise ValueError(f"'{e}' used as a number but is not Int/Real")
            return e
        head, args = e[0], e[1:]
        if head == "-" and len(args) == 1:
            inner = self.term(args[0])
            return -inner if isinstance(inner, (int, float)) else Arith(op="sub", args=[0, inner])
        if head in ("+", "-", "*", "/"):
            if head == "+" and all(_is_count_item(a) for a in args):
                return Count(op="count", args=[self.formula(a[1]) for a in args])
            op = {"+": "add", "-": "sub", "*": "mul", "/": "div"}[head]
            terms = [self.term(a) for a in args]
            if op in ("sub", "div") and len(terms) > 2:
                out = terms[0]
                for t in terms[1:]:
                    out = Arith(op=op, args=[out, t])
                return out
            return Arith(op=op, args=terms)
        if head == "ite":
            return TermIte(op="ite", **{"if": self.formula(args[0]), "then": self.term(args[1]), "else": self.term(args[2])})
        if head == "to_real":
            return self.term(args[0])
        raise ValueError(f"unsupported numeric operator '{head}'")


def _is_num(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _is_count_item(a) -> bool:
    return isinstance(a, list) and len(a) == 4 and a[0] == "ite" and a[2] == "1" and a[3] == "0"
