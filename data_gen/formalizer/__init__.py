"""The formalizer: the one implementation of a formalizer stage, shared by the teacher pipeline
(`data_gen/runner.py`), the matching service (`serve/`) and the benchmarks (`bench/`): render the
prompt -> call an OpenAI-compatible endpoint with structured output -> validate strictly with
verdict_core -> one repair attempt with the problems fed back -> accepted, or rejected with its
reason.

    fz = Formalizer(load_teacher("gpt-4.1"), cache=CallCache(path), ledger=..., egress=...)
    res = await fz.parse_trial(trial)                         # StageResult, res.output: TrialProgram
    inc = await fz.mine_values(res.output, patient, "inclusion")  # res.output: list[MinedValue]

Modules: `runtime.py` (the endpoint, stage loop, cache, single flight; arbiter and verbalizer),
`parser.py` (trial parser), `miner.py` (value miner), `checks.py` (shared checks and schemas).
"""

from .checks import REASONS, SIDES, Check, compact, core_schema, normalize_ws, parse_json, quote_in_note, with_atom_enum
from .miner import check_miner_output, miner_messages, render_atoms, side_atoms
from .parser import check_parser_output, parser_messages
from .runtime import Formalizer

__all__ = [
    "REASONS", "SIDES", "Check", "Formalizer", "check_miner_output", "check_parser_output", "compact", "core_schema",
    "miner_messages", "normalize_ws", "parse_json", "parser_messages", "quote_in_note", "render_atoms", "side_atoms",
    "with_atom_enum",
]
