"""Hand-checkable decisions: each expectation below can be verified by reading the program."""

import pytest
from verdict.core.counterfactual import apply_pivotal, pivotal_flip_rate
from verdict.core.decision import Override
from verdict.core.engine import Engine
from verdict.core.errors import ProgramError

from .helpers import atom, patient, program

ENGINE = Engine()
A_OR_B = program([{"op": "or", "args": ["a", "b"]}], atoms=[atom("a"), atom("b")])


def test_eligible_pivot_names_open_atoms_to_confirm():
    """Trial requires A or B; A observed, B open: changing A alone would not flip the decision, so
    δ_I is {A false, B confirmed false}, not step 5's {A false}."""
    p = patient(A_OR_B, a=True)
    d = ENGINE.decide(A_OR_B, p)
    assert d.decision == "eligible"
    got = {(c.atom, c.action, c.current, c.target) for c in d.pivotal.conditions}
    assert got == {("a", "change", True, False), ("b", "confirm", None, False)}
    assert ENGINE.decide(A_OR_B, apply_pivotal(p, d.pivotal.conditions)).decision == "ineligible"
    assert {(a.atom, a.cls) for a in d.assumptions} == {("b", "inert")}  # a observed true already meets it


def test_assumption_classes():
    prog = program(
        [{"op": "or", "args": ["a", "b"]}], exclusion=["c"], atoms=[atom("a"), atom("b"), atom("c")]
    )
    d = ENGINE.decide(prog, patient(prog))
    classes = {a.atom: (a.cls, a.value) for a in d.assumptions}
    assert classes == {"a": ("alternative", None), "b": ("alternative", None), "c": ("forced", False)}
    # the forced exclusion is the single pivot, stated as a requirement
    assert [(c.atom, c.target, c.requirement.text) for c in d.pivotal.conditions] == [("c", True, "c = true")]


def test_numeric_pivots_are_requirements_not_witnesses():
    atoms = [atom("creat", "real", "lab_value", unit="mg/dL")]
    prog = program([{"op": "cmp", "lhs": "creat", "rel": "le", "rhs": 2.0}], atoms=atoms)
    d = ENGINE.decide(prog, patient(prog, creat=3.1))
    assert d.decision == "ineligible"
    (c,) = d.pivotal.conditions
    assert c.requirement.text == "creat <= 2.0 mg/dL"
    assert c.current == 3.1 and c.target == 2.0
    assert [(iv.lo, iv.hi, iv.hi_strict) for iv in c.requirement.intervals] == [(None, 2.0, False)]
    d2 = ENGINE.decide(prog, patient(prog))
    forced = {a.atom: a for a in d2.assumptions}
    assert forced["creat"].cls == "forced" and forced["creat"].requirement.text == "creat <= 2.0 mg/dL"
    assert d2.pivotal.conditions[0].requirement.text == "creat > 2.0 mg/dL"


def test_ineligible_trace_names_violated_criteria_and_facts():
    prog = program(["a", "b"], exclusion=["c"], atoms=[atom("a"), atom("b"), atom("c")])
    d = ENGINE.decide(prog, patient(prog, a=False, b=True, c=True))
    assert d.decision == "ineligible"
    steps = {(s.criterion, s.status, tuple(f.atom for f in s.facts)) for s in d.trace.steps}
    assert steps == {("inc0", "violated", ("a",)), ("exc0", "violated", ("c",))}
    assert len(d.pivotal.conditions) == 2  # both must change


def test_joint_violation_is_traced_even_when_no_single_criterion_fails():
    prog = program(["a"], exclusion=["a"], atoms=[atom("a")])  # a contradiction only jointly
    with pytest.raises(ProgramError):
        ENGINE.check_satisfiable(prog)
    prog = program([{"op": "or", "args": ["a", "b"]}], exclusion=["a", "b"], atoms=[atom("a"), atom("b")])
    d = ENGINE.decide(prog, patient(prog))
    assert d.decision == "ineligible"
    assert all(lb.label == "deferred" for lb in d.labels)
    assert len([s for s in d.trace.steps if s.status == "violated"]) == 1


def test_multi_cohort_eligibility_and_joint_pivot():
    cohorts = [
        {"id": "x", "inclusion": [{"id": "i", "text": "a", "formula": "a"}]},
        {"id": "y", "inclusion": [{"id": "i", "text": "b", "formula": "b"}]},
    ]
    prog = program([], cohorts=cohorts, atoms=[atom("a"), atom("b")])
    p = patient(prog, a=True, b=True)
    d = ENGINE.decide(prog, p)
    assert d.decision == "eligible" and d.trace.admitting_cohorts == ["x", "y"]
    assert {c.atom for c in d.pivotal.conditions} == {"a", "b"}  # both cohorts must fail
    assert ENGINE.decide(prog, apply_pivotal(p, d.pivotal.conditions)).decision == "ineligible"


def test_extraction_conflict_is_reported_apart_and_arbiter_can_resolve_it():
    atoms = [atom("q"), atom("s"), atom("z")]
    defs = [
        {
            "id": "q-implies-s",
            "kind": "qualifier_implies_stem",
            "formula": {"op": "implies", "if": "q", "then": "s"},
        }
    ]
    prog = program(["z"], exclusion=["q"], atoms=atoms, definitions=defs)
    p = patient(prog, q=True, s=False, z=True)
    d = ENGINE.decide(prog, p)
    assert [(c.atoms, c.definitions) for c in d.conflicts] == [(["q", "s"], ["q-implies-s"])]
    assert d.decision == "eligible"  # not ineligible because of the conflict: q, s set aside

    def arbiter(conflicts, program_, patient_):
        return [Override(atom="s", value=True, reason="chart says hypertension on medication")]

    d2 = ENGINE.decide(prog, p, arbiter=arbiter)
    assert d2.overrides[0].atom == "s" and d2.decision == "ineligible"  # q true stands, exclusion applies


def test_solver_limit_gives_undetermined_with_reason():
    atoms = [atom(n, "int", "other") for n in ("x", "y", "z")]
    cube = lambda v: {"op": "mul", "args": [v, v, v]}  # noqa: E731
    fermat = {
        "op": "cmp",
        "lhs": {"op": "add", "args": [cube("x"), cube("y")]},
        "rel": "eq",
        "rhs": cube("z"),
    }
    pos = [{"op": "cmp", "lhs": v, "rel": "ge", "rhs": 1} for v in ("x", "y", "z")]
    prog = program([fermat] + pos, atoms=atoms)
    d = Engine(timeout_ms=200).decide(prog, patient(prog))
    assert d.decision == "undetermined"
    assert "solver limit" in d.reason


def test_pivotal_flip_rate_is_one_in_both_directions():
    progs = [A_OR_B, program(["a"], exclusion=["b"], atoms=[atom("a"), atom("b")])]
    cases = []
    for i, prog in enumerate(progs):
        for values in ({}, {"a": True}, {"a": False}, {"a": True, "b": True}, {"b": False}):
            cases.append((f"{i}-{values}", prog, patient(prog, **values)))
    rates, outcomes = pivotal_flip_rate(ENGINE, cases)
    assert {r.direction: (r.cases > 0, r.rate) for r in rates} == {
        "to_eligible": (True, 1.0),
        "to_ineligible": (True, 1.0),
    }
    assert all(o.flipped for o in outcomes)


# ---- threads: servers and benchmarks decide in worker threads ----------------------------------
def _reference_cases(n: int):
    from verdict.core.cases import load_case
    from verdict.core.policy import load_policy

    from tests.support import REFERENCE_V6, need

    need(REFERENCE_V6.is_dir(), f"reference corpus at {REFERENCE_V6}")
    policy = load_policy("prescreen")
    out = []
    for f in sorted(REFERENCE_V6.glob("*/*__full.json"))[:n]:
        case = load_case(f)
        out.append((case.program, case.patient_under(policy)))
    return out


def test_deciding_leaves_no_z3_object_in_a_reference_cycle():
    """A cycle is freed by the garbage collector in whichever thread triggers it, which may be in
    the middle of another thread's solver call on the same (not thread-safe) context."""
    import gc

    import z3

    cases = _reference_cases(30)
    kinds = set()
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for prog, p in cases:
            d = ENGINE.decide(prog, p)
            kinds.add(d.decision)
            if d.pivotal is not None and d.pivotal.conditions:
                ENGINE.decide(prog, apply_pivotal(p, d.pivotal.conditions))
        gc.collect()
        leaked = [
            type(o).__name__
            for o in gc.garbage
            if isinstance(o, (z3.AstRef, z3.ModelRef, z3.Solver, z3.Optimize, z3.AstVector))
        ]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    assert kinds == {"eligible", "ineligible"}  # both artifact paths ran
    assert leaked == []


def test_threads_with_garbage_collection_decide_like_one_thread():
    import gc
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import z3

    cases = _reference_cases(24)
    expected = [ENGINE.decide(prog, p).model_dump_json() for prog, p in cases]
    stop = threading.Event()

    def collect():
        # Another thread (as an event loop would) leaves z3 terms in a reference cycle and
        # triggers a collection: the collector must not release them during a solver call.
        junk_engine = Engine()
        while not stop.is_set():
            with junk_engine._lock:
                xs = [z3.Int(f"junk{i}", junk_engine.ctx) for i in range(30)]
                solver = z3.Solver(ctx=junk_engine.ctx)
                solver.add([x + i > y for i, (x, y) in enumerate(zip(xs, xs[1:]))])
                node = {"terms": xs, "solver": solver}
                node["self"] = node
            del node
            gc.collect(0)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda c: Engine().decide(*c).model_dump_json(), cases * 3))
    finally:
        stop.set()
        collector.join()
    assert got == expected * 3


def test_a_program_no_patient_can_satisfy_is_named_not_a_solver_limit():
    """Inclusion age > 18 and an exclusion 'age >= 18' (an exclusion-side requirement recorded the
    wrong way round): no patient can be eligible. The decision says so and names both criteria,
    instead of a MaxSMT that 'did not finish'."""
    atoms = [atom("age", "int", "demographic"), atom("a")]
    prog = program(
        [{"op": "cmp", "lhs": "age", "rel": "gt", "rhs": 18}, "a"],
        exclusion=[{"op": "cmp", "lhs": "age", "rel": "ge", "rhs": 18}],
        atoms=atoms,
    )
    with pytest.raises(Exception) as e:
        ENGINE.check_satisfiable(prog)
    assert "cohort 'main': criteria main/inc0, main/exc0 cannot all be met together" in str(e.value)
    for values in ({"age": 40, "a": True}, {"age": 12}, {}):
        d = ENGINE.decide(prog, patient(prog, **values))
        assert d.decision == "ineligible" and not d.incomplete, d.incomplete
        assert (
            d.reason.startswith("the trial program admits no patient") and "main/inc0, main/exc0" in d.reason
        )
        assert d.pivotal.direction == "to_eligible" and d.pivotal.conditions == []
    d = ENGINE.decide(A_OR_B, patient(A_OR_B, a=False, b=False))  # an ordinary ineligible: unchanged
    assert d.reason is None and d.pivotal.conditions


def test_a_collection_never_waits_for_a_solver_call():
    """The collector frees z3 garbage in whichever thread it runs (an event loop's included): it must
    not wait there for another thread's solver call; the release is deferred to the next lock holder."""
    import gc
    import threading
    import time

    import z3

    engine = Engine()
    with engine._lock:
        xs = [z3.Int(f"gc{i}", engine.ctx) for i in range(50)]
        node = {"terms": xs, "solver": z3.Solver(ctx=engine.ctx)}
        node["self"] = node
        del xs
    held, released = threading.Event(), threading.Event()

    def solver_call():  # stands in for a long solver call in a worker thread
        with engine._lock:
            held.set()
            time.sleep(3.0)
        released.set()

    worker = threading.Thread(target=solver_call)
    worker.start()
    held.wait()
    del node
    gc.collect()
    # had the collector waited for the lock, the worker would have let it go first (no clock involved)
    returned_while_held = not released.is_set()
    worker.join()
    assert returned_while_held
    with engine._lock:  # the deferred releases run here
        pass
    assert engine._lock._pending == []


def test_a_label_the_definitions_alone_settle_cites_no_fact():
    """Found by the renaming property test in CI: the solver's consequences named the observed n
    as the reason a tautology holds, so the citation depended on its search. The label cites no
    fact under any naming of the atoms."""
    from verdict.core.patient import Resolution, ResolvedPatient

    le4 = {"op": "cmp", "lhs": "x", "rel": "le", "rhs": 4}
    either_way = {
        "op": "at_least",
        "k": 1,
        "args": [  # (a -> x <= 4) or (x <= 4 -> a) always holds
            {"op": "and", "args": [{"op": "cmp", "lhs": "n", "rel": "gt", "rhs": 0}, "d"]},
            {"op": "implies", "if": "a", "then": le4},
            {"op": "implies", "if": le4, "then": "a"},
        ],
    }
    atoms = [
        atom("a"),
        atom("d"),
        atom("n", domain="int", kind="lab_value", unit="u"),
        atom("x", domain="real", kind="lab_value", unit="u"),
    ]
    prog = program([either_way], atoms=atoms)
    open_ = [Resolution(atom=a, status="unresolved") for a in ("a", "d", "x")]
    n = Resolution(atom="n", status="observed", value=0, evidence="n is 0")
    d = Engine().decide(
        prog,
        ResolvedPatient(
            patient_id="p", trial_id="T1", program_hash=prog.content_hash, resolutions=[*open_, n]
        ),
    )
    assert [(lb.criterion, lb.label, lb.facts) for lb in d.labels] == [("inc0", "satisfied", [])]
    assert d.decision == "eligible"


def test_a_compiled_program_settles_a_question_once_and_forgetting_programs_compiles_again():
    """`CompiledProgram.settled` keeps what the program alone settles across patients (the engine and
    the compiler share it), and `Engine.forget_programs` is the latency benchmark's cold start."""
    prog = program(["a"], exclusion=["b"], atoms=[atom("a"), atom("b")])
    engine = Engine()
    first = engine.compiled(prog)
    asked = []
    assert first.settled(("q",), lambda: asked.append(1) or "answer") == "answer"
    assert first.settled(("q",), lambda: asked.append(1) or "other") == "answer"
    assert asked == [1]
    assert engine.compiled(prog) is first
    engine.forget_programs()
    again = engine.compiled(prog)
    assert again is not first
    assert again.settled(("q",), lambda: "fresh") == "fresh"
    assert engine.decide(prog, patient(prog, a=True, b=False)).decision == "eligible"
