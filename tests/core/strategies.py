"""Hypothesis strategies: small random trial programs and patients in the core's formal language."""

from __future__ import annotations

from hypothesis import strategies as st
from verdict.core.patient import Bounds, Resolution, ResolvedPatient
from verdict.core.program import TrialProgram, check_program

BOOLS = ["a", "b", "c", "d"]
NUMS = {"n": "int", "x": "real"}
RELS = ["lt", "le", "gt", "ge", "eq", "ne"]


@st.composite
def formulas(draw, depth=2):
    leaf = st.one_of(
        st.sampled_from(BOOLS),
        st.builds(
            lambda n, r, c: {"op": "cmp", "lhs": n, "rel": r, "rhs": c},
            st.sampled_from(sorted(NUMS)),
            st.sampled_from(RELS),
            st.integers(0, 5),
        ),
    )
    if depth == 0:
        return draw(leaf)
    sub = formulas(depth=depth - 1)
    return draw(
        st.one_of(
            leaf,
            st.builds(lambda f: {"op": "not", "arg": f}, sub),
            st.builds(
                lambda op, args: {"op": op, "args": args},
                st.sampled_from(["and", "or"]),
                st.lists(sub, min_size=2, max_size=3),
            ),
            st.builds(lambda p, q: {"op": "implies", "if": p, "then": q}, sub, sub),
            st.builds(
                lambda k, args: {"op": "at_least", "k": k, "args": args},
                st.integers(1, 2),
                st.lists(sub, min_size=2, max_size=3),
            ),
        )
    )


definition_patterns = st.one_of(
    st.builds(
        lambda p, q: {"op": "implies", "if": p, "then": q}, st.sampled_from(BOOLS), st.sampled_from(BOOLS)
    ),
    st.builds(
        lambda p, n, c: {"op": "iff", "args": [p, {"op": "cmp", "lhs": n, "rel": "ge", "rhs": c}]},
        st.sampled_from(BOOLS),
        st.sampled_from(sorted(NUMS)),
        st.integers(0, 5),
    ),
)


@st.composite
def programs(draw):
    atoms = [{"name": n, "domain": "bool", "kind": "diagnosis", "definition": f"finding {n}"} for n in BOOLS]
    atoms += [
        {"name": n, "domain": d, "kind": "lab_value", "unit": "u", "definition": f"measure {n}"}
        for n, d in NUMS.items()
    ]
    cohorts = []
    for ci in range(draw(st.integers(1, 2))):
        inc = [
            {"id": f"i{k}", "text": f"inclusion {ci}.{k}", "formula": draw(formulas())}
            for k in range(draw(st.integers(1, 3)))
        ]
        exc = [
            {"id": f"e{k}", "text": f"exclusion {ci}.{k}", "formula": draw(formulas())}
            for k in range(draw(st.integers(0, 2)))
        ]
        cohorts.append({"id": f"c{ci}", "inclusion": inc, "exclusion": exc})
    defs = [{"id": f"d{k}", "formula": draw(definition_patterns)} for k in range(draw(st.integers(0, 2)))]
    return check_program(
        TrialProgram.model_validate(
            {"trial_id": "T", "atoms": atoms, "definitions": defs, "cohorts": cohorts}
        )
    )


@st.composite
def patients(draw, program: TrialProgram):
    rs = []
    for a in program.atoms:
        kind = draw(st.sampled_from(["open", "value", "value"] + (["bounds"] if a.domain != "bool" else [])))
        if kind == "open":
            rs.append(Resolution(atom=a.name, status="unresolved"))
        elif kind == "bounds":
            lo = draw(st.integers(0, 4))
            rs.append(
                Resolution(
                    atom=a.name,
                    status="observed",
                    bounds=Bounds(lo=lo, hi=lo + draw(st.integers(1, 2))),
                    evidence=f"{a.name} range",
                )
            )
        else:
            v = draw(st.booleans()) if a.domain == "bool" else draw(st.integers(-1, 6))
            if a.domain == "real" and not isinstance(v, bool):
                v = float(v) + draw(st.sampled_from([0.0, 0.5]))
            rs.append(Resolution(atom=a.name, status="observed", value=v, evidence=f"{a.name} is {v}"))
    return ResolvedPatient(
        patient_id="p", trial_id=program.trial_id, program_hash=program.content_hash, resolutions=rs
    )
