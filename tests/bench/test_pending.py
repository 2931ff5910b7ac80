"""bench/pending.py: the rules every bench loop over paid endpoints shares."""

from __future__ import annotations

import logging

from verdict.bench.pending import Pending
from verdict.data_gen.formalizer import BudgetExhausted, EndpointError


def test_a_budget_stop_halts_and_keeps_the_first_message():
    state, after = Pending(), []
    for msg in ("first stop", "second stop"):
        with state.item("pair p1 on b"):
            raise BudgetExhausted(msg)
            after.append(msg)  # never reached: the item's block ends
    assert state.halted and state.stop.startswith("first stop") and not after and state.failed == 0


def test_an_endpoint_error_leaves_the_item_unless_its_status_is_fatal(caplog):
    state = Pending()
    with caplog.at_level(logging.WARNING, logger="verdict.bench"), state.item("pair p1 on b", {401}):
        raise EndpointError("server error", status=500)
    assert state.failed == 1 and not state.halted
    assert "pair p1 on b: endpoint error, left for the next run" in caplog.text
    with state.item("pair p2 on b", {401}):
        raise EndpointError("bad key", status=401)
    assert state.failed == 1 and state.halted and state.fatal.status == 401
