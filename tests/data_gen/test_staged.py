"""Staged value mining (issue 23): the exclusion side first, the inclusion side only when it can
change the decision; over real HTTP to the scripted server, and the stop rule's equality with
exhaustive mining as a property on the reference corpus (random programs: tests/core)."""

from __future__ import annotations

import asyncio
import functools
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verdict.core.engine import Engine
from verdict.core.patient import MinedValue
from verdict.core.policy import load_policy, resolve
from verdict.core.program import TrialProgram, check_program
from verdict.core.ranking import rank
from verdict.core.settled import NOT_ASKED, RESTS_ON_UNASKED, settles
from verdict.data_gen.formalizer import Formalizer, side_atoms
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.protocol import PatientDoc
from verdict.data_gen.formalizer.staged import decide_pair, unasked_after_first
from verdict.data_gen.scripted_server import Script
from verdict.data_gen.scripted_server import ScriptedResponse as R

from ..support import REFERENCE_V6, need
from .teacher_data import program, trial_id

ENGINE = Engine()
POLICY = load_policy("prescreen")
PREGNANT = "A 37-year-old woman with condition 1, currently pregnant at 20 weeks."
NOT_PREGNANT = "A 37-year-old woman with condition 1; pregnancy test negative."


def staged_and_exhaustive(url: str, note: str):
    prog = check_program(TrialProgram(trial_id=trial_id(1), **program(1)))

    async def go():
        fz = Formalizer(EndpointConfig(name="t", base_url=url, model="m", timeout_s=5, max_retries=0))
        try:
            doc = PatientDoc(patient_id="p1", text=note)
            return [await decide_pair(fz, ENGINE, prog, doc, POLICY, staged=s) for s in (True, False)]
        finally:
            await fz.aclose()

    return asyncio.run(go())


def script(pregnant: bool) -> Script:
    values = {
        "age_years": {"value": 37, "evidence": "37-year-old"},
        "has_condition_1": {"value": True, "evidence": "condition 1"},
        "is_pregnant": {
            "value": pregnant,
            "evidence": "pregnant at 20 weeks" if pregnant else "pregnancy test negative",
        },
    }
    return Script(default=R(auto="sparse", auto_values=values, only_quoted=True))


def sides_asked(srv) -> list[str]:
    return sorted(
        {
            "exclusion" if "exclusion side" in r.body["messages"][1]["content"] else "inclusion"
            for r in srv.requests
        }
    )


def test_an_exclusion_that_settles_the_decision_leaves_the_inclusion_side_unasked(scripted_server):
    scripted_server.set_script(script(pregnant=True))
    scripted_server.reset()
    (staged, patient, d), (full, _, d_full) = staged_and_exhaustive(scripted_server.url, PREGNANT)
    assert d.decision == d_full.decision == "ineligible"
    assert staged.not_asked == {"age_years": NOT_ASKED, "has_condition_1": NOT_ASKED}
    assert staged.inc.usage.calls_paid == 0 and staged.inc.assembly["not_asked"] == [
        "age_years",
        "has_condition_1",
    ]
    by_atom = patient.by_atom()
    assert by_atom["age_years"].status == "unresolved" and by_atom["age_years"].note == NOT_ASKED
    assert by_atom["is_pregnant"].value is True
    assert not full.not_asked  # exhaustive mining asked both sides
    # δ_E and the ranking say that they rest on atoms not asked; the exhaustive decision's do not
    assert RESTS_ON_UNASKED in d.pivotal.note and RESTS_ON_UNASKED not in (d_full.pivotal.note or "")
    row, row_full = rank([d])[0], rank([d_full])[0]
    assert row.rests_on_unasked and "not asked" in row.reason and not row_full.rests_on_unasked
    # staged: one call (exclusion); exhaustive: both sides
    assert len(scripted_server.requests) == 3


def test_a_decision_the_first_stage_cannot_settle_mines_both_sides(scripted_server):
    scripted_server.set_script(script(pregnant=False))
    scripted_server.reset()
    (staged, _, d), (_, _, d_full) = staged_and_exhaustive(scripted_server.url, NOT_PREGNANT)
    assert d.decision == d_full.decision == "eligible" and not staged.not_asked
    assert staged.inc.usage.calls_paid == 1 and sides_asked(scripted_server) == ["exclusion", "inclusion"]


# ---- the stop rule on the reference corpus --------------------------------------------------------
@functools.lru_cache(maxsize=1)
def reference_cases():
    from verdict.core.reference import load_reference

    need(REFERENCE_V6.is_dir(), "reference corpus missing")
    return [load_reference(p) for p in sorted(REFERENCE_V6.glob("*/*__full.json"))]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.data())
def test_on_the_reference_corpus_a_settled_pair_decides_as_exhaustive_mining(data):
    """A reference pair, its recorded values thinned at random (as a weaker reader would find them):
    when the stop rule fires after the exclusion side, the decision with every recorded inclusion
    value (the exhaustive mining) is the staged one, ineligible."""
    cases = reference_cases()
    case = cases[data.draw(st.integers(0, len(cases) - 1))]
    program = case.program
    observed = [r for r in case.patient.resolutions if r.status == "observed"]
    kept = [r for r in observed if data.draw(st.booleans(), label=r.atom)]
    values = [
        MinedValue(atom=r.atom, value=r.value, bounds=r.bounds, evidence=r.evidence or "") for r in kept
    ]
    unasked = unasked_after_first(program)
    first = set(side_atoms(program, "exclusion"))
    stage1 = resolve(
        program,
        "p",
        [v for v in values if v.atom in first],
        POLICY,
        held_open={a: NOT_ASKED for a in unasked},
    )
    if not (unasked and settles(program, stage1, unasked, ENGINE)):
        return
    full = resolve(program, "p", values, POLICY)
    assert ENGINE.decide(program, stage1).decision == ENGINE.decide(program, full).decision == "ineligible"
    json.dumps(stage1.model_dump(mode="json"))  # the marks travel in the record
