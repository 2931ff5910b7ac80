"""Routing a large fact sheet to a trial's atoms (issue 23, formalizer/routing.py): a pair's cost
bounded by one call's budget whatever the chart, every atom's best evidence read first, text never
altered, small sheets read whole as before."""

from __future__ import annotations

from verdict.core.program import TrialProgram
from verdict.data_gen.formalizer.budget import qwen25_counter
from verdict.data_gen.formalizer.mining_plan import plan_miner_calls
from verdict.data_gen.formalizer.reader import Excerpt
from verdict.data_gen.formalizer.routing import SheetRoute, SheetRouter, atom_term, reads_whole, stems

COUNTER = qwen25_counter()


def atom(name: str, definition: str, kind: str = "diagnosis", domain: str = "bool", unit=None) -> dict:
    return {
        "name": name,
        "domain": domain,
        "kind": kind,
        "unit": unit,
        "definition": definition,
        "source_criteria": ["exc1"],
    }


ATOMS = [
    atom("age_years", "The patient's age in years.", "demographic", "int", "years"),
    atom("has_anemia", "Hemoglobin below 10 g/dL or a diagnosis of anemia.", "lab_value"),
    atom("has_asthma", "The patient has asthma.", "diagnosis"),
    atom("uses_insulin", "The patient is treated with insulin.", "medication"),
]


def program() -> TrialProgram:
    names = [a["name"] for a in ATOMS]
    return TrialProgram.model_validate(
        {
            "trial_id": "NCT-ROUTE",
            "atoms": ATOMS,
            "cohorts": [
                {
                    "id": "main",
                    "exclusion": [{"id": f"exc{i}", "text": n, "formula": n} for i, n in enumerate(names, 1)],
                }
            ],
        }
    )


def filler(i: int) -> str:
    return f"Visit {i}: routine review of the ward rota number {i * 7}, parking permit renewed, form {i}."


def sheet(n_filler: int) -> list[Excerpt]:
    """Facts spread through a sheet of `n_filler` unrelated excerpts (their words meet no atom)."""
    facts = {
        n_filler // 4: Excerpt(
            document="d-lab", offset=0, text="Hgb 8.9 g/dL.", terms=["hemoglobin", "anemia"]
        ),
        n_filler // 2: Excerpt(document="d-hx", offset=0, text="Known asthmatic since childhood."),
        3 * n_filler // 4: Excerpt(document="d-hx", offset=40, text="A 61-year-old man."),
    }
    out = []
    for i in range(n_filler):
        out.append(Excerpt(document=f"f{i // 10}", offset=i * 100, text=filler(i)))
        if i in facts:
            out.append(facts[i])
    return out


def plan(excerpts: list[Excerpt], route: bool = True):
    router = SheetRouter.build(excerpts, COUNTER.count_text)
    prog = program()
    return plan_miner_calls(
        prog,
        router.documents(list(range(len(excerpts)))),
        "exclusion",
        count_messages=COUNTER.count_messages,
        count_text=COUNTER.count_text,
        prompt_budget=3000,
        completion_budget=1024,
        route=SheetRoute(prog, router, route_above_tokens=0, route_tokens=2048) if route else None,
    )


def test_stems_meet_across_spellings_and_leave_out_words_that_say_nothing():
    assert "age" in stems("A 58-year-old woman") and "female" in stems("A 58-year-old woman")
    assert "age" in stems("patient age value recorded now in years")
    assert stems("diabetic") & stems("diabetes")
    assert not stems("the patient has a history of") and not stems("in is of on")
    assert atom_term("patient_has_finding_of_angina_decubitus@@at_least_10_days") == "angina decubitus"


def test_a_small_sheet_is_read_whole_by_every_chunk_as_before():
    small = sheet(4)
    assert [c.texts for c in plan(small)] == [c.texts for c in plan(small, route=False)]


def test_the_one_routing_rule_reads_a_sheet_whole_up_to_either_limit_and_routes_it_above_both():
    assert reads_whole(4096, route_above_tokens=4096, call_budget=100)  # small: routing would not pay
    assert not reads_whole(4097, route_above_tokens=4096, call_budget=4096)
    assert reads_whole(5000, route_above_tokens=4096, call_budget=5000)  # larger, but one call holds it
    assert not reads_whole(5001, route_above_tokens=4096, call_budget=5000)
    assert reads_whole(0, route_above_tokens=0, call_budget=0)
    assert not reads_whole(1, route_above_tokens=0, call_budget=0)


def test_a_sheet_route_reads_whole_by_route_tokens_when_the_model_has_no_limits():
    router = SheetRouter.build(sheet(40), COUNTER.count_text)
    total = router.total_tokens()
    route = SheetRoute(program(), router, route_above_tokens=0, route_tokens=total)
    assert route.reads_whole(None) and not route.reads_whole(total - 1)  # a call's note budget, if any
    assert not SheetRoute(program(), router, route_above_tokens=0, route_tokens=total - 1).reads_whole(None)
    assert SheetRoute(program(), router, route_above_tokens=total, route_tokens=1).reads_whole(1)
    assert route.routed == []  # deciding reads nothing


def test_a_sheet_above_half_the_room_that_one_call_still_holds_is_planned_as_the_whole_sheet():
    """The planner's note reserve (half the room beside the bare prompt) is no routing threshold:
    a sheet larger than it but within the call's note budget reads whole, in the whole plan."""
    mid = sheet(60)  # about 1,900 tokens: above half the 3,000-token prompt's room, within one call
    routed = plan(mid)
    assert len(routed) == 1 and [c.texts for c in routed] == [c.texts for c in plan(mid, route=False)]


def test_a_large_sheet_costs_what_a_small_one_costs_and_every_call_fits_its_budget():
    small, large, huge = plan(sheet(8)), plan(sheet(400)), plan(sheet(4000))
    assert len(plan(sheet(400), route=False)) > 3 * len(large)  # unrouted: the sheet in many groups
    assert len(large) == len(huge) <= max(1, len(small))
    assert all(c.prompt_tokens <= 3000 for c in large + huge)
    words = sum(COUNTER.count_text(t) for c in huge for t in c.texts)
    assert words < 3000 * len(huge)  # bounded by the call, not by a sheet of 4,000 excerpts


def test_each_atom_reads_its_evidence_even_far_into_a_large_sheet_by_words_or_by_reader_terms():
    calls = plan(sheet(4000))
    read = " ".join(t for c in calls for t in c.texts)
    assert "Hgb 8.9 g/dL." in read  # shares no word with 'anemia' but its terms do
    assert "Known asthmatic since childhood." in read
    assert "A 61-year-old man." in read  # an age in the chart's own spelling
    assert "parking permit" not in read  # nothing any atom asks about


def test_routing_never_alters_text_and_keeps_chart_order_within_a_document():
    ex = sheet(400)
    router = SheetRouter.build(ex, COUNTER.count_text)
    chosen = router.pick(program(), ["has_asthma", "age_years"], 300)
    assert chosen == sorted(chosen)
    docs = router.documents(chosen)
    hx = next(d for d in docs if d.id == "d-hx")
    assert hx.text == "Known asthmatic since childhood.\n\nA 61-year-old man."


def test_the_budget_holds_and_atoms_take_turns_so_each_gets_its_best_first():
    ex = [Excerpt(document="d", offset=i, text=f"Asthma flare number {i} treated.") for i in range(50)]
    ex.append(Excerpt(document="e", offset=0, text="On insulin glargine nightly."))
    router = SheetRouter.build(ex, COUNTER.count_text)
    chosen = router.pick(program(), ["has_asthma", "uses_insulin"], 80)
    assert len(ex) - 1 in chosen  # insulin's only excerpt, though asthma has fifty
    used = sum(router.tokens[i] for i in chosen) + 24 * len({ex[i].document for i in chosen})
    assert used <= 80


def test_excerpts_that_score_the_same_rank_in_chart_order_whatever_the_sets_order():
    """0.1 + 0.2 + 0.3 summed in set order is 0.6 or 0.6000000000000001 by the process's string
    hashes: the ranking (and so which excerpts a chunk reads) changed from run to run."""
    router = SheetRouter(
        excerpts=[],
        tokens=[1, 1],
        words=[{"d"}, {"a", "b", "c"}],
        idf={"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.6},
    )
    for query in ({"a", "b", "c", "d"}, {"d", "c", "b", "a"}, {"c", "a", "d", "b"}):
        assert router.ranked(query) == [0, 1]


def test_a_one_document_sheet_that_fills_a_call_exactly_reads_whole():
    """A call renders one document without a header (as the planner measures the record): counting
    one made a sheet that fits its call be routed, each chunk reading a subset of it."""
    one = [Excerpt(document="d-only", offset=i * 100, text=filler(i)) for i in range(30)]
    router = SheetRouter.build(one, COUNTER.count_text)
    fits = sum(router.tokens)
    assert router.total_tokens() == fits
    assert SheetRoute(program(), router, route_above_tokens=0, route_tokens=fits).reads_whole(None)
    assert not SheetRoute(program(), router, route_above_tokens=0, route_tokens=fits - 1).reads_whole(None)
