"""Hand-written trial programs the serve tests upload (admin role), as JSON bodies."""

from __future__ import annotations

import re

# The test teacher (a double of the API teacher): what it leaves out of scope, how it reads an age bound.
OUT_OF_SCOPE = re.compile(r"consent|agree to|willing|criteria are met:$", re.I)
AGE = re.compile(r"\baged? (\d{2})\b", re.I)


def atom(name: str, domain: str = "bool", definition: str | None = None) -> dict:
    return {"name": name, "domain": domain, "kind": "other", "definition": definition or f"Quantity {name}."}


def program(trial_id: str, inclusion_atom: str, inclusion_text: str = "Adults") -> dict:
    """Inclusion on its own atom, exclusion on chest pain: trials share the exclusion pass."""
    return {
        "trial_id": trial_id,
        "atoms": [atom(inclusion_atom, "int"), atom("has_chest_pain", definition="Has chest pain.")],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [
                    {
                        "id": "inc1",
                        "text": inclusion_text,
                        "formula": {"op": "cmp", "lhs": inclusion_atom, "rel": "ge", "rhs": 18},
                    }
                ],
                "exclusion": [{"id": "exc1", "text": "Chest pain", "formula": "has_chest_pain"}],
            }
        ],
    }


def cubes(trial_id: str, n: int) -> dict:
    """n criteria x^3 + y^3 + z^3 = k (k without a known small solution): each is hard for Z3."""
    ks = (33, 114, 165, 390, 579, 627, 633, 732, 906, 921, 975)
    atoms, criteria = [], []
    for i in range(n):
        names = [f"x{i}", f"y{i}", f"z{i}"]
        atoms += [atom(v, "int") for v in names]
        cube = [{"op": "mul", "args": [v, v, v]} for v in names]
        criteria.append(
            {
                "id": f"inc{i}",
                "text": f"sum of cubes {i}",
                "formula": {
                    "op": "cmp",
                    "lhs": {"op": "add", "args": cube},
                    "rel": "eq",
                    "rhs": ks[i % len(ks)],
                },
            }
        )
    return {"trial_id": trial_id, "atoms": atoms, "cohorts": [{"id": "main", "inclusion": criteria}]}


def fermat(trial_id: str) -> dict:
    """x^3 + y^3 = z^3 + w, x, y, z >= 1: satisfiable, but with w = 0 from the note (Fermat) the
    decision runs into the solver limit."""

    def cube(v):
        return {"op": "mul", "args": [v, v, v]}

    return {
        "trial_id": trial_id,
        "atoms": [atom(n, "int") for n in "wxyz"],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [
                    {
                        "id": "inc1",
                        "text": "x^3 + y^3 = z^3 + w",
                        "formula": {
                            "op": "cmp",
                            "lhs": {"op": "add", "args": [cube("x"), cube("y")]},
                            "rel": "eq",
                            "rhs": {"op": "add", "args": [cube("z"), "w"]},
                        },
                    },
                    *[
                        {
                            "id": f"pos_{v}",
                            "text": f"{v} >= 1",
                            "formula": {"op": "cmp", "lhs": v, "rel": "ge", "rhs": 1},
                        }
                        for v in "xyz"
                    ],
                ],
            }
        ],
    }


def teacher_output(c, names: set[str]):
    """The test teacher's formalization of one criterion (its last line: the lead-in is shared): out
    of scope for consent, willingness and headings; `age_years >= N` for an inclusion age bound; else one
    chart-checkable bool atom named from its first words (`names`: those taken, kept unique)."""
    from verdict.core.program import Atom, ParsedCriterion

    line = c.text.strip().splitlines()[-1].lstrip("- ").strip()
    if OUT_OF_SCOPE.search(line):
        return ParsedCriterion(
            in_scope=False, reason="consent, willingness or a heading: not chart-checkable"
        )
    age = AGE.search(line)
    if age and c.side == "inclusion":
        atom = Atom(
            name="age_years", domain="int", kind="demographic", unit="years", definition="Age in years."
        )
        return ParsedCriterion(
            in_scope=True,
            atoms=[atom],
            formula={"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": int(age.group(1))},
        )
    words = re.findall(r"[a-z0-9]+", line.lower())[:6]
    name = "_".join(words)[:48].strip("_") or "criterion"
    while name in names:
        name += "_x"
    names.add(name)
    atom = Atom(name=name, domain="bool", kind="other", definition=f"The chart shows: {line[:160]}")
    return ParsedCriterion(in_scope=True, atoms=[atom], formula=name)
