"""`Formalizer`: one endpoint's runtime with every stage as a method, the package's public entry.

Each stage is a module of its own, a function of the runtime (`runtime.Runtime`): the trial parser
(`parser.py`), the value miner on a note or a chart read once (`miner.py`, `reader.py`), the arbiter
(`arbiter.py`) and the verbalizer (`verbalizer.py`). This class only gathers them, with the state
some keep across calls (values reused across trials, fact sheets shared by a patient's trials).
"""

from __future__ import annotations

from collections.abc import Collection

from verdict.core.program import TrialProgram

from .arbiter import arbitrate
from .criteria import CriterionText
from .endpoint_config import EndpointConfig
from .miner_prompt import miner_messages
from .parser import criterion_messages, parse_trial, trial_criteria, trial_request_key
from .protocol import PatientDoc, StageResult, TrialDoc
from .reader import ChartReading, FactSheets, mine_chart
from .runtime import Runtime
from .value_reuse import ValueReuse
from .verbalizer import verbalize


class Formalizer(Runtime):
    """Formalizer stages against one endpoint (a teacher or a student)."""

    def __init__(
        self,
        endpoint: EndpointConfig,
        *,
        value_reuse: ValueReuse | None = None,
        reading: ChartReading | None = None,
        **runtime,
    ):
        """`value_reuse`: mined values of a patient record reused across trials (None: mine every
        time); `reading`: long charts read once per patient record version (None: every chart mined
        whole); the rest: `Runtime`'s (engine, cache, ledger, egress, prompts, run, client)."""
        super().__init__(endpoint, **runtime)
        self.value_reuse = value_reuse
        self.reading = reading
        self.fact_sheets = FactSheets()

    # -- requests (also used by dry runs) ----------------------------------------------------------
    def criterion_messages(self, criterion: CriterionText) -> list[dict[str, str]]:
        """The parser request of one criterion (see `parser.py`)."""
        return criterion_messages(criterion, self.prompts.get("parser", "v1"))

    def parser_key(self, trial: TrialDoc) -> str:
        """The key of a whole trial parse (criteria + endpoint + prompt version; see `parser.py`)."""
        return trial_request_key(self, trial)

    def trial_criteria(self, trial: TrialDoc):
        """The trial's criteria as this endpoint's parser calls them (split to fit its budget)."""
        return trial_criteria(self, trial)

    def miner_messages(
        self, program: TrialProgram, note: str, side: str, names: list[str]
    ) -> list[dict[str, str]]:
        return miner_messages(program, note, side, names, self.prompts.get(f"miner_{side}"))

    # -- stages ------------------------------------------------------------------------------------
    async def parse_trial(self, trial: TrialDoc) -> StageResult:
        """Criteria text -> one call per criterion -> assembled, checked TrialProgram (see `parser.py`)."""
        return await parse_trial(self, trial)

    async def mine_values(
        self,
        program: TrialProgram,
        note: PatientDoc | str,
        side: str,
        *,
        data_class: str | None = None,
        skip: Collection[str] = (),
    ) -> StageResult:
        """Patient record + the side's atoms (less `skip`) -> checked values with evidence (see
        `miner.py`); a long chart through its fact sheet, read once (see `reader.py`)."""
        return await mine_chart(self, program, note, side, data_class=data_class, skip=skip)

    async def arbitrate(
        self, program: TrialProgram, note: PatientDoc | str, patient, conflicts
    ) -> StageResult:
        """Re-read the chart for atoms whose values contradict definitions (see `arbiter.py`)."""
        return await arbitrate(self, program, note, patient, conflicts)

    async def verbalize(
        self, program: TrialProgram, patient, decision, *, data_class: str = "private"
    ) -> StageResult:
        """Restate a Decision for clinicians (see `verbalizer.py`); it decides nothing."""
        return await verbalize(self, program, patient, decision, data_class=data_class)
