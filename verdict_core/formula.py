"""The formula language: a small typed JSON AST.

Why JSON and not SMT-LIB text: a 7B student emits it under JSON-schema-constrained decoding
(xgrammar), so every output is syntactically valid by construction, and the core checks it
strictly (declared atoms, types) by walking typed objects, with no regex or text parsing.

Grammar (``docs/formula-language.md`` has the long version)::

    Formula := ATOM_NAME                                  a declared bool atom
             | {"op": "const",    "value": true|false}
             | {"op": "not",      "arg": Formula}
             | {"op": "and"|"or", "args": [Formula, ...]}            (1 or more)
             | {"op": "implies",  "if": Formula, "then": Formula}
             | {"op": "iff",      "args": [Formula, Formula]}
             | {"op": "cmp",      "lhs": Term, "rel": REL, "rhs": Term}
             | {"op": "at_least"|"at_most", "k": INT, "args": [Formula, ...]}
    Term    := NUMBER | ATOM_NAME                         a declared int/real atom
             | {"op": "add"|"mul", "args": [Term, Term, ...]}
             | {"op": "sub"|"div", "args": [Term, Term]}
             | {"op": "count",    "args": [Formula, ...]}  number of true formulas
             | {"op": "ite",      "if": Formula, "then": Term, "else": Term}
    REL     := "lt" | "le" | "gt" | "ge" | "eq" | "ne"

A bare string is an atom reference: a bool atom where a Formula is expected, a numeric atom
where a Term is expected. Whether the name is declared and of the right domain is checked by
``check_formula`` against the program's atom table, never by the schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
)

# Atom names: identifiers plus the separators real formalizers use ("@@qualifier", "::", "-", ".").
# At most MAX_NAME characters, checked by a validator with its own clear message; the JSON schema
# states both. Structured outputs decode under a narrower form of it (schemas.grammar_form).
ATOM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_@.:\-]*$"
MAX_NAME = 256


def _short(s: str) -> str:
    if len(s) > MAX_NAME:
        raise ValueError(f"longer than {MAX_NAME} characters")
    return s


def identifier(pattern: str):
    """A string type for names and ids: the pattern and at most MAX_NAME characters."""
    return Annotated[
        str,
        StringConstraints(pattern=pattern),
        AfterValidator(_short),
        WithJsonSchema({"type": "string", "pattern": pattern, "maxLength": MAX_NAME}),
    ]


AtomName = identifier(ATOM_NAME_PATTERN)

# Numbers in programs and patient values: finite and at most 1e15 in magnitude. Clinical quantities
# are far inside it; beyond it a float no longer holds every integer, and 10**400 or NaN would fail
# deep inside the solver or the JSON writer instead of at the input.
MAX_MAGNITUDE = 1e15
# Formula nesting (operators inside operators, terms included): far above any criterion, and far
# below the JSON reader's own recursion limit (two JSON levels per node at most), so a program that
# validates always reloads. The same bound applies on write and on read.
MAX_DEPTH = 64


def number_problem(x) -> str | None:
    """Why a number is not allowed (not finite, or beyond MAX_MAGNITUDE), or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if isinstance(x, float) and x != x:
        return "NaN is not a number a program or chart can use"
    if abs(x) > MAX_MAGNITUDE:
        return (
            f"{'infinite' if isinstance(x, float) and abs(x) == float('inf') else 'too large'}: numbers must "
            f"be finite and at most {MAX_MAGNITUDE:g} in magnitude"
        )
    return None


def _bounded_number(x):
    why = number_problem(x)
    if why:
        raise ValueError(why)
    return x


Rel = Literal["lt", "le", "gt", "ge", "eq", "ne"]
REL_SYMBOL: dict[str, str] = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=", "ne": "!="}
NEGATED_REL: dict[str, str] = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
FLIPPED_REL: dict[str, str] = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ---- boolean formulas -------------------------------------------------------------------------
class Const(_Node):
    op: Literal["const"]
    value: StrictBool


class Not(_Node):
    op: Literal["not"]
    arg: Formula


class And(_Node):
    op: Literal["and"]
    args: list[Formula] = Field(min_length=1)


class Or(_Node):
    op: Literal["or"]
    args: list[Formula] = Field(min_length=1)


class Implies(_Node):
    op: Literal["implies"]
    if_: Formula = Field(alias="if")
    then: Formula


class Iff(_Node):
    op: Literal["iff"]
    args: list[Formula] = Field(min_length=2, max_length=2)


class Cmp(_Node):
    op: Literal["cmp"]
    lhs: Term
    rel: Rel
    rhs: Term


class AtLeast(_Node):
    op: Literal["at_least"]
    k: StrictInt = Field(ge=0)
    args: list[Formula] = Field(min_length=1)


class AtMost(_Node):
    op: Literal["at_most"]
    k: StrictInt = Field(ge=0)
    args: list[Formula] = Field(min_length=1)


# ---- numeric terms ----------------------------------------------------------------------------
class Arith(_Node):
    op: Literal["add", "sub", "mul", "div"]
    args: list[Term] = Field(min_length=2)


class Count(_Node):
    op: Literal["count"]
    args: list[Formula] = Field(min_length=1)


class TermIte(_Node):
    op: Literal["ite"]
    if_: Formula = Field(alias="if")
    then: Term
    else_: Term = Field(alias="else")


FormulaNode = Annotated[
    Const | Not | And | Or | Implies | Iff | Cmp | AtLeast | AtMost, Field(discriminator="op")
]
Formula = AtomName | FormulaNode
TermNode = Annotated[Arith | Count | TermIte, Field(discriminator="op")]
Number = Annotated[StrictInt | StrictFloat, AfterValidator(_bounded_number)]
Term = Number | AtomName | TermNode

for _cls in (Not, And, Or, Implies, Iff, Cmp, AtLeast, AtMost, Arith, Count, TermIte):
    _cls.model_rebuild()


# ---- nesting bound ----------------------------------------------------------------------------
def nesting_depth(data, stop: int = MAX_DEPTH) -> tuple[int, str]:
    """(depth, path of the deepest node) of a formula given as JSON-like data or as nodes, counting
    operator nodes; iterative, and it stops just past ``stop``, so hostile input costs little."""
    best, best_path = 0, ""
    stack = [(data, 0, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, _Node):
            depth += 1
            kids = [(suffix, child) for suffix, child, _ in children(node)]
        elif isinstance(node, dict):
            depth += "op" in node
            kids = [(f".{k}", v) for k, v in node.items()]
        elif isinstance(node, list):
            kids = [(f"[{i}]", v) for i, v in enumerate(node)]
        else:
            continue
        if depth > best:
            best, best_path = depth, path
        if depth > stop:
            break
        stack.extend((v, depth, path + suffix) for suffix, v in kids if isinstance(v, (dict, list, _Node)))
    return best, best_path


def _bounded_depth(data):
    depth, path = nesting_depth(data)
    if depth > MAX_DEPTH:
        raise ValueError(
            f"formula nested deeper than {MAX_DEPTH} levels (at {_compact_path(path) or 'the top'})"
        )
    return data


def _compact_path(path: str) -> str:
    """'.args[0].args[0].arg' -> 'args[0]*2.arg': a path through a deep formula, readable."""
    out: list[list] = []
    for part in path.lstrip(".").split(".") if path else []:
        if out and out[-1][0] == part:
            out[-1][1] += 1
        else:
            out.append([part, 1])
    return ".".join(p if n == 1 else f"{p}*{n}" for p, n in out)


# A top-level formula (criterion, definition): its nesting is bounded before it is validated.
BoundedFormula = Annotated[Formula, BeforeValidator(_bounded_depth)]


# ---- walking ----------------------------------------------------------------------------------
def children(node: Formula | Term) -> Iterator[tuple[str, Formula | Term, bool]]:
    """Yield (path suffix, child, child_is_formula) for one node."""
    if isinstance(node, (Not,)):
        yield ".arg", node.arg, True
    elif isinstance(node, (And, Or, Iff, AtLeast, AtMost, Count)):
        for i, a in enumerate(node.args):
            yield f".args[{i}]", a, True
    elif isinstance(node, Implies):
        yield ".if", node.if_, True
        yield ".then", node.then, True
    elif isinstance(node, Cmp):
        yield ".lhs", node.lhs, False
        yield ".rhs", node.rhs, False
    elif isinstance(node, Arith):
        for i, a in enumerate(node.args):
            yield f".args[{i}]", a, False
    elif isinstance(node, TermIte):
        yield ".if", node.if_, True
        yield ".then", node.then, False
        yield ".else", node.else_, False


def atom_refs(
    node: Formula | Term, is_formula: bool = True, path: str = ""
) -> Iterator[tuple[str, str, bool]]:
    """Every atom reference under ``node`` as (name, path, used_as_formula)."""
    if isinstance(node, str):
        yield node, path, is_formula
        return
    for suffix, child, child_is_formula in children(node):
        yield from atom_refs(child, child_is_formula, path + suffix)


def atoms_in(node: Formula | Term, is_formula: bool = True) -> set[str]:
    return {name for name, _, _ in atom_refs(node, is_formula)}


def polarities(
    node: Formula, positive: bool = True, out: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Polarity of each bool atom occurrence ('+' / '-'); atoms under iff, comparisons or counts
    get both, since their truth can push the formula either way."""
    out = {} if out is None else out

    def mark(name: str, pol: set[str]) -> None:
        out.setdefault(name, set()).update(pol)

    both = {"+", "-"}
    if isinstance(node, str):
        mark(node, {"+" if positive else "-"})
    elif isinstance(node, Not):
        polarities(node.arg, not positive, out)
    elif isinstance(node, (And, Or, AtLeast)):
        for a in node.args:
            polarities(a, positive, out)
    elif isinstance(node, AtMost):
        for a in node.args:
            polarities(a, not positive, out)
    elif isinstance(node, Implies):
        polarities(node.if_, not positive, out)
        polarities(node.then, positive, out)
    elif isinstance(node, (Iff, Cmp)):
        for name in atoms_in(node):
            mark(name, both)
    return out


def simple_comparisons(node: Formula | Term, positive: bool = True) -> Iterator[tuple[str, str, float, bool]]:
    """Comparisons of one numeric atom with a constant, normalized to (atom, rel, constant, positive),
    e.g. ``{"lhs": 2, "rel": "lt", "rhs": "x"}`` gives ("x", "gt", 2, True)."""
    if isinstance(node, Cmp):
        if isinstance(node.lhs, str) and is_number(node.rhs):
            yield node.lhs, node.rel, float(node.rhs), positive
        elif isinstance(node.rhs, str) and is_number(node.lhs):
            yield node.rhs, FLIPPED_REL[node.rel], float(node.lhs), positive
        return
    if isinstance(node, Not):
        yield from simple_comparisons(node.arg, not positive)
        return
    for _, child, _ in children(node) if not isinstance(node, str) else ():
        yield from simple_comparisons(child, positive)


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def numeric_in_complex_terms(f: Formula) -> set[str]:
    """Numeric atoms that occur somewhere other than 'atom REL constant'."""
    out: set[str] = set()

    def walk(node, is_formula):
        if isinstance(node, Cmp):
            simple = (isinstance(node.lhs, str) and is_number(node.rhs)) or (
                isinstance(node.rhs, str) and is_number(node.lhs)
            )
            if not simple:
                out.update(atoms_in(node.lhs, False) | atoms_in(node.rhs, False))
            for _, child, child_is_formula in children(node):
                if not isinstance(child, str):
                    walk(child, child_is_formula)
            return
        if isinstance(node, str) or is_number(node):
            return
        for _, child, child_is_formula in children(node):
            walk(child, child_is_formula)

    walk(f, True)
    return out


# ---- rendering --------------------------------------------------------------------------------
def fmt_number(x: float | int) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return f"{x:.1f}"
    return repr(x) if isinstance(x, float) else str(x)


def render(node: Formula | Term, label=lambda name: name) -> str:
    """A compact human-readable rendering, e.g. ``(A or B) and creatinine <= 2.0``."""
    if isinstance(node, str):
        return label(node)
    if is_number(node):
        return fmt_number(node)  # type: ignore[arg-type]
    r = lambda n: render(n, label)  # noqa: E731
    match node:
        case Const():
            return "true" if node.value else "false"
        case Not():
            return f"not {_paren(node.arg, r)}"
        case And() | Or():
            return f" {node.op} ".join(_paren(a, r) for a in node.args)
        case Implies():
            return f"if {_paren(node.if_, r)} then {_paren(node.then, r)}"
        case Iff():
            return f"{_paren(node.args[0], r)} iff {_paren(node.args[1], r)}"
        case Cmp():
            return f"{r(node.lhs)} {REL_SYMBOL[node.rel]} {r(node.rhs)}"
        case AtLeast() | AtMost():
            word = "at least" if node.op == "at_least" else "at most"
            return f"{word} {node.k} of ({', '.join(r(a) for a in node.args)})"
        case Arith():
            sym = {"add": " + ", "sub": " - ", "mul": " * ", "div": " / "}[node.op]
            return "(" + sym.join(r(a) for a in node.args) + ")"
        case Count():
            return f"count({', '.join(r(a) for a in node.args)})"
        case TermIte():
            return f"(if {r(node.if_)} then {r(node.then)} else {r(node.else_)})"
    raise TypeError(f"not a formula node: {node!r}")


def _paren(node: Formula | Term, r) -> str:
    s = r(node)
    return f"({s})" if isinstance(node, (And, Or, Implies, Iff)) else s


def rename(node: Formula | Term, mapping: dict[str, str]) -> Formula | Term:
    """A copy of ``node`` with atom references renamed (used by tests and the reference importer)."""
    if isinstance(node, str):
        return mapping.get(node, node)
    if is_number(node):
        return node
    data = node.model_dump(by_alias=True)
    return type(node).model_validate(_rename_dump(data, mapping))


def _rename_dump(data, mapping):
    if isinstance(data, str):
        return mapping.get(data, data)
    if isinstance(data, list):
        return [_rename_dump(x, mapping) for x in data]
    if isinstance(data, dict):
        return {
            k: (v if k in ("op", "rel", "k", "value") else _rename_dump(v, mapping)) for k, v in data.items()
        }
    return data


# ---- evaluation -------------------------------------------------------------------------------
class Unknown(Exception):
    """An atom the assignment leaves open was needed."""


def evaluate(node: Formula | Term, env: dict, is_formula: bool = True):
    """Value of ``node`` under ``env`` (atom -> bool/number). Raises Unknown for a missing atom.
    Division by zero yields 0, as an arbitrary but fixed choice (the solver leaves it unspecified)."""
    if isinstance(node, str):
        if node not in env or env[node] is None:
            raise Unknown(node)
        return env[node]
    if is_number(node):
        return node
    ev = lambda n, f=True: evaluate(n, env, f)  # noqa: E731
    match node:
        case Const():
            return node.value
        case Not():
            return not ev(node.arg)
        case And():
            return all(ev(a) for a in node.args)
        case Or():
            return any(ev(a) for a in node.args)
        case Implies():
            return (not ev(node.if_)) or ev(node.then)
        case Iff():
            return ev(node.args[0]) == ev(node.args[1])
        case Cmp():
            a, b = ev(node.lhs, False), ev(node.rhs, False)
            return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[
                node.rel
            ]
        case AtLeast():
            return sum(bool(ev(a)) for a in node.args) >= node.k
        case AtMost():
            return sum(bool(ev(a)) for a in node.args) <= node.k
        case Arith():
            vals = [ev(a, False) for a in node.args]
            out = vals[0]
            for v in vals[1:]:
                if node.op == "add":
                    out = out + v
                elif node.op == "sub":
                    out = out - v
                elif node.op == "mul":
                    out = out * v
                else:
                    out = out / v if v != 0 else 0
            return out
        case Count():
            return sum(bool(ev(a)) for a in node.args)
        case TermIte():
            return ev(node.then, False) if ev(node.if_) else ev(node.else_, False)
    raise TypeError(f"not a formula node: {node!r}")


def kleene(node: Formula, env: dict):
    """Three-valued value of a formula under a partial assignment: True / False / None (unknown).
    Sound: a True/False answer holds in every completion. env values are bools, numbers, or
    objects with ``lo``/``hi``/``lo_strict``/``hi_strict`` (an interval the atom lies in)."""
    if isinstance(node, str):
        return env.get(node)
    match node:
        case Const():
            return node.value
        case Not():
            v = kleene(node.arg, env)
            return None if v is None else not v
        case And():
            vals = [kleene(a, env) for a in node.args]
            return False if False in vals else (None if None in vals else True)
        case Or():
            vals = [kleene(a, env) for a in node.args]
            return True if True in vals else (None if None in vals else False)
        case Implies():
            a, b = kleene(node.if_, env), kleene(node.then, env)
            return True if a is False or b is True else (False if a is True and b is False else None)
        case Iff():
            a, b = kleene(node.args[0], env), kleene(node.args[1], env)
            return None if a is None or b is None else a == b
        case AtLeast() | AtMost():
            vals = [kleene(a, env) for a in node.args]
            t, u = vals.count(True), vals.count(None)
            if node.op == "at_least":
                return True if t >= node.k else (False if t + u < node.k else None)
            return True if t + u <= node.k else (False if t > node.k else None)
        case Cmp():
            return _kleene_cmp(node, env)
    return None


def _kleene_cmp(node: Cmp, env: dict):
    lhs, rhs, rel = node.lhs, node.rhs, node.rel
    if is_number(lhs) and isinstance(rhs, str):
        lhs, rhs, rel = rhs, lhs, FLIPPED_REL[rel]
    try:
        if isinstance(lhs, str) and is_number(rhs):
            v = env.get(lhs)
            if v is None:
                return None
            if hasattr(v, "lo"):  # an interval: decided when it lies on one side of the constant
                return _interval_cmp(v, rel, float(rhs))
            return evaluate(node, {lhs: v})
        return evaluate(node, env)
    except (Unknown, ZeroDivisionError, TypeError, AttributeError):
        return None


def _interval_cmp(b, rel: str, c: float):
    lo, hi = b.lo, b.hi
    below = hi is not None and (hi < c or (hi == c and b.hi_strict))  # every value < c
    above = lo is not None and (lo > c or (lo == c and b.lo_strict))  # every value > c
    at_most = hi is not None and hi <= c  # every value <= c
    at_least = lo is not None and lo >= c
    table = {
        "lt": True if below else (False if at_least else None),
        "le": True if at_most else (False if above else None),
        "gt": True if above else (False if at_most else None),
        "ge": True if at_least else (False if below else None),
        "eq": False if below or above else (True if lo is not None and lo == hi == c else None),
        "ne": True if below or above else (False if lo is not None and lo == hi == c else None),
    }
    return table[rel]
