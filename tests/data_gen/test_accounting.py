"""Per-pair cost (data_gen/formalizer/accounting.py): what a pair sent, and the one-time reading."""

from verdict.data_gen.formalizer.accounting import PairCost, cost_total, pair_cost
from verdict.data_gen.formalizer.protocol import ChartRead, StageResult, Usage

from .teacher_data import accepted_result


def side(calls: int, hits: int, prompt: int, completion: int, reused_atoms=0, chart_read=None) -> StageResult:
    return accepted_result(
        "miner_inclusion",
        usage=Usage(
            calls_paid=calls,
            cache_hits=hits,
            prompt_tokens=prompt * 2,  # tokens of cache hits are in the totals, not in what was sent
            completion_tokens=completion * 2,
            paid_prompt_tokens=prompt,
            paid_completion_tokens=completion,
        ),
        assembly={"reused_atoms": reused_atoms},
        chart_read=chart_read,
    )


def test_a_pair_counts_what_its_sides_sent_not_cache_hits():
    cost = pair_cost(side(2, 1, 300, 20, reused_atoms=3), side(1, 0, 100, 5))
    assert cost.mining.model_dump() == {
        "calls": 3,
        "cache_hits": 1,
        "prompt_tokens": 400,
        "completion_tokens": 25,
    }
    assert cost.reused_atoms == 3 and cost.reading is None and cost.paid() == cost.mining


def test_the_reading_is_this_pairs_when_one_side_paid_it_and_nobodys_when_both_reused():
    read = ChartRead(documents=134, calls=12, prompt_tokens=24_000, completion_tokens=900)
    paid = pair_cost(
        side(1, 0, 100, 5, chart_read=read),
        side(1, 0, 100, 5, chart_read=read.model_copy(update={"reused": True})),
    )
    assert paid.reading.calls == 12 and not paid.reading_reused
    assert paid.paid().calls == 14 and paid.paid().prompt_tokens == 24_200
    again = read.model_copy(update={"reused": True})
    reused = pair_cost(side(1, 0, 100, 5, chart_read=again), side(1, 0, 100, 5, chart_read=again))
    assert reused.reading_reused and reused.paid().calls == 2


def test_totals_count_each_reading_once_and_give_per_pair_means():
    read = PairCost.model_validate(
        {
            "mining": {"calls": 2, "prompt_tokens": 200, "completion_tokens": 10},
            "reading": {"calls": 10, "prompt_tokens": 9000},
        }
    )
    reuse = read.model_copy(update={"reading_reused": True})
    t = cost_total([read, reuse, reuse, reuse])
    assert t["chart_readings"] == 1 and t["calls"] == 2 * 4 + 10 and t["calls_per_pair"] == 4.5
    assert t["prompt_tokens"] == 800 + 9000 and cost_total([])["calls_per_pair"] == 0


def test_a_chart_mined_whole_is_no_reading_and_cached_reader_calls_are_listed_apart():
    whole = ChartRead(documents=3, mined_whole=True)
    cost = pair_cost(side(1, 0, 100, 5, chart_read=whole), side(1, 0, 100, 5, chart_read=whole))
    assert cost.reading is None and cost_total([cost])["chart_readings"] == 0
    rerun = ChartRead(documents=134, calls=0, cache_hits=12)  # a rerun: every reader call from the cache
    again = pair_cost(side(1, 0, 100, 5, chart_read=rerun))
    assert again.reading.calls == 0 and again.reading.cache_hits == 12 and again.paid().calls == 1
