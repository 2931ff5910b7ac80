"""Token and cost accounting for a run, and the budget stop.

Before each paid call the ledger reserves the call's worst-case cost (estimated prompt tokens plus
the full max_tokens of output); if spent + reserved + this call could exceed the budget the call
is not sent (`BudgetExhausted`) and the run stops cleanly. Actual cost, known from the response's
usage, replaces the reservation. Spent money survives restarts: it is read from the cache's ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cache import CallCache
from .endpoint_config import EndpointConfig
from .errors import BudgetExhausted

# Conservative prompt-token estimate without a tokenizer: English and clinical text run at about
# 4 bytes per token in current BPE vocabularies; 3 bytes per token overestimates on purpose.
BYTES_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8


def estimate_prompt_tokens(messages: list[dict[str, str]]) -> int:
    return sum(
        TOKENS_PER_MESSAGE + math.ceil(len(m.get("content", "").encode()) / BYTES_PER_TOKEN) for m in messages
    )


def worst_case_cost(teacher: EndpointConfig, messages: list[dict[str, str]], max_tokens: int) -> float:
    return teacher.prices.cost(estimate_prompt_tokens(messages), max_tokens)


@dataclass
class Ledger:
    cache: CallCache
    run: str
    budget_usd: float | None = None
    spent_at_start: float = 0.0
    spent_now: float = 0.0
    reserved: float = 0.0
    stopped: bool = False
    _open: dict[int, float] = field(default_factory=dict)
    _next: int = 0

    def __post_init__(self):
        self.spent_at_start = self.cache.spent(self.run)

    @property
    def spent(self) -> float:
        return self.spent_at_start + self.spent_now

    def reserve(self, worst_case_usd: float) -> int:
        """Reserve room for one call; raise BudgetExhausted (and stop further calls) if it may not fit."""
        if self.budget_usd is not None and (
            self.stopped or self.spent + self.reserved + worst_case_usd > self.budget_usd + 1e-12
        ):
            self.stopped = True
            raise BudgetExhausted(
                f"budget stop: ${self.spent:.4f} spent of ${self.budget_usd:.4f}; the next call could cost "
                f"up to ${worst_case_usd:.4f} more. Nothing more is sent; re-run with a higher --budget-usd "
                "to continue"
            )
        self._next += 1
        self._open[self._next] = worst_case_usd
        self.reserved += worst_case_usd
        return self._next

    def settle(self, ticket: int, actual_usd: float | None) -> None:
        """Release a reservation; ``actual_usd`` None means the call cost nothing (it failed)."""
        self.reserved -= self._open.pop(ticket, 0.0)
        if actual_usd:
            self.spent_now += actual_usd
