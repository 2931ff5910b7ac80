"""How a bench loop over pending items survives its paid endpoints: one `Pending` per loop.

A budget stop lets no further item start (the items in flight finish); an endpoint error leaves
its item for the next run (counted, logged by ids only); a fatal error ends the run once the items
in flight are done. The runner's pairs, the counterfactuals and the chart-reading comparisons share
these rules.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from verdict.data_gen.formalizer import BudgetExhausted, EndpointError

log = logging.getLogger("verdict.bench")


@dataclass
class Pending:
    stop: str | None = None  # the budget stop's message
    fatal: Exception | None = None
    failed: int = 0  # items left for the next run after an endpoint error
    paid: float = 0.0  # USD paid by the items done

    @property
    def halted(self) -> bool:
        """No further item starts."""
        return bool(self.stop) or self.fatal is not None

    @contextmanager
    def item(self, what: str, fatal_status: Collection[int] = ()) -> Iterator[None]:
        """Around one item (`what`: its ids, as logged): a budget stop or an endpoint error ends the
        item's block, and is recorded here; an endpoint error with a `fatal_status` is fatal."""
        try:
            yield
        except BudgetExhausted as e:
            self.stop = self.stop or str(e)
        except EndpointError as e:
            if e.status in fatal_status:
                self.fatal = self.fatal or e
            else:
                self.failed += 1
                log.warning("%s: endpoint error, left for the next run: %s", what, e.summary)
