"""Formula AST -> SMT-LIB 2 text, so a whole program reaches Z3 in one parse call (C speed)
instead of thousands of Python API calls. Every symbol is |quoted| (atom names may contain ':')."""

from __future__ import annotations

from decimal import Decimal

from .formula import (
    And,
    Arith,
    AtLeast,
    AtMost,
    Cmp,
    Const,
    Count,
    Formula,
    Iff,
    Implies,
    Not,
    Or,
    Term,
    TermIte,
    is_number,
)

SORT = {"bool": "Bool", "int": "Int", "real": "Real"}
_REL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}


def sym(name: str) -> str:
    return f"|{name}|"


def num(x, sort: str = "Real") -> str:
    if isinstance(x, int) and not isinstance(x, bool) and sort == "Int":
        return str(x) if x >= 0 else f"(- {-x})"
    d = Decimal(repr(float(x))) if not isinstance(x, int) else Decimal(x)
    text = format(abs(d), "f")
    if "." not in text:
        text += ".0"
    return text if d >= 0 else f"(- {text})"


class Writer:
    def __init__(self, domains: dict[str, str]):
        self.domains = domains  # atom -> bool|int|real

    def formula(self, f: Formula) -> str:
        if isinstance(f, str):
            return sym(f)
        match f:
            case Const():
                return "true" if f.value else "false"
            case Not():
                return f"(not {self.formula(f.arg)})"
            case And() | Or():
                return (
                    f"({f.op} {' '.join(self.formula(a) for a in f.args)})"
                    if len(f.args) > 1
                    else self.formula(f.args[0])
                )
            case Implies():
                return f"(=> {self.formula(f.if_)} {self.formula(f.then)})"
            case Iff():
                return f"(= {self.formula(f.args[0])} {self.formula(f.args[1])})"
            case Cmp():
                (a, sa), (b, sb) = self.term(f.lhs), self.term(f.rhs)
                a, b = self._align(a, sa, f.lhs, b, sb, f.rhs)
                if f.rel == "ne":
                    return f"(not (= {a} {b}))"
                return f"({_REL[f.rel]} {a} {b})"
            case AtLeast():
                return f"(>= {self._count(f.args)} {f.k})"
            case AtMost():
                return f"(<= {self._count(f.args)} {f.k})"
        raise TypeError(f"unknown formula node {f!r}")

    def _count(self, args) -> str:
        items = [f"(ite {self.formula(a)} 1 0)" for a in args]
        return items[0] if len(items) == 1 else f"(+ {' '.join(items)})"

    def term(self, t: Term) -> tuple[str, str]:
        """(text, sort) with sort Int or Real."""
        if isinstance(t, str):
            return sym(t), SORT[self.domains[t]]
        if is_number(t):
            sort = "Int" if isinstance(t, int) else "Real"
            return num(t, sort), sort
        match t:
            case Arith():
                parts = [self.term(a) for a in t.args]
                sort = "Real" if t.op == "div" or any(s == "Real" for _, s in parts) else "Int"
                texts = [self._as(p, s, a, sort) for (p, s), a in zip(parts, t.args)]
                op = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[t.op]
                out = texts[0]
                for x in texts[1:]:  # left-assoc; n-ary SMT-LIB - and / mean the same
                    out = f"({op} {out} {x})"
                return out, sort
            case Count():
                return self._count(t.args), "Int"
            case TermIte():
                (a, sa), (b, sb) = self.term(t.then), self.term(t.else_)
                a, b = self._align(a, sa, t.then, b, sb, t.else_)
                sort = "Real" if "Real" in (sa, sb) else "Int"
                return f"(ite {self.formula(t.if_)} {a} {b})", sort
        raise TypeError(f"unknown term node {t!r}")

    def _as(self, text: str, sort: str, node, want: str) -> str:
        if sort == want:
            return text
        if is_number(node):
            return num(float(node), "Real")
        return f"(to_real {text})"

    def _align(self, a, sa, na, b, sb, nb):
        if sa == sb:
            return a, b
        return self._as(a, sa, na, "Real"), self._as(b, sb, nb, "Real")
