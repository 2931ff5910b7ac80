"""The formalizer: the one implementation of a formalizer stage, shared by the teacher pipeline
(`data_gen/runner.py`), the matching service (`serve/`) and the benchmarks (`bench/`): render the
prompt -> call an OpenAI-compatible endpoint with structured output -> validate strictly with
verdict_core -> one repair attempt with the problems fed back -> accepted, or rejected with its
reason.

    fz = Formalizer(load_teacher("gpt-4.1"), cache=CallCache(path), ledger=..., egress=...)
    res = await fz.parse_trial(trial)                         # StageResult, res.output: TrialProgram
    inc = await fz.mine_values(res.output, patient, "inclusion")  # res.output: list[MinedValue]

Modules: `stages.py` (`Formalizer`: the entry, every stage a method), `runtime.py` (the endpoint,
stage loop, cache, single flight; imports no stage), the stages: `parser.py` (trial parser, per
criterion; `criteria.py` the criteria split, `assembly.py` criterion outputs -> one program),
`miner.py` (value miner; `miner_prompt.py` its request and check, `mining_plan.py` its calls
planned, `findings.py` their merge), `reader.py` (a long chart read once; `chart.py` its reductions,
`routing.py` the fact sheet routed to atom chunks), `staged.py` (the two sides in stages),
`arbiter.py`, `verbalizer.py`; `checks.py` (shared checks and schemas).
"""

from .assembly import assemble, criterion_outputs
from .checks import (
    REASONS,
    SIDES,
    Check,
    compact,
    core_schema,
    normalize_ws,
    parse_json,
    quote_in_note,
    with_atom_enum,
)
from .criteria import CriterionText, split_trial
from .findings import MinedValues, PassageConflict, merge_sides
from .miner_prompt import check_miner_output, miner_messages, render_atoms, side_atoms
from .mining_plan import PlannedCall, plan_miner_calls
from .parser import check_criterion_output, criterion_messages
from .stages import Formalizer

__all__ = [
    "REASONS",
    "SIDES",
    "Check",
    "CriterionText",
    "Formalizer",
    "assemble",
    "check_criterion_output",
    "check_miner_output",
    "compact",
    "core_schema",
    "criterion_messages",
    "criterion_outputs",
    "miner_messages",
    "normalize_ws",
    "parse_json",
    "quote_in_note",
    "render_atoms",
    "side_atoms",
    "split_trial",
    "with_atom_enum",
    "MinedValues",
    "PassageConflict",
    "PlannedCall",
    "merge_sides",
    "plan_miner_calls",
]
