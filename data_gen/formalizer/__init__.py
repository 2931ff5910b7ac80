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

This package is the formalizer's one public entry: every other part (the teacher pipeline, train,
serve, bench) imports the names below from `verdict.data_gen.formalizer`, never from a module of it
(tests/test_layering.py checks), so the modules can move without the callers knowing.
"""

from .accounting import PairCost, cost_total, pair_cost
from .arbiter import definition_conflicts, redecide
from .assembly import assemble, criterion_outputs
from .budget import (
    STUDENT_STAGES,
    StudentLimits,
    TokenCounter,
    apply_limits,
    derive_limits,
    limits_of,
    load_limits,
    qwen25_counter,
    qwen25_tokenizer_file,
    student_limit_keys,
)
from .cache import CallCache, open_db
from .chart import locate, reduce_chart
from .checks import (
    REASONS,
    SIDES,
    Check,
    compact,
    core_schema,
    normalize_ws,
    parse_json,
    parse_output,
    quote_in_note,
    split_pieces,
    with_atom_enum,
)
from .client import EndpointClient, build_request
from .criteria import CriterionText, normalize_criterion, split_trial
from .egress import EGRESS_RULE, ENV_ALLOW, EgressPolicy, is_loopback
from .endpoint_config import DataClass, EgressConfig, EndpointConfig, SourceEgress, StageTokens, load_teacher
from .endpoints import EndpointPool, PoolMember, failure_reason
from .errors import BudgetExhausted, ConfigError, EgressRefused, EndpointError, SourceError
from .findings import MinedValues, PassageConflict, merge_sides
from .ledger import Ledger, estimate_prompt_tokens
from .miner import MINER_BUDGET, mine_values
from .miner_prompt import (
    asked_atoms,
    check_miner_output,
    miner_messages,
    miner_target,
    render_atoms,
    side_atoms,
)
from .mining_plan import MinerBudgetError, PlannedCall, as_documents, plan_for, plan_miner_calls
from .parser import check_criterion_output, criterion_messages
from .passages import paragraph_spans
from .prompt_templates import PROMPTS_DIR, load_prompt, stage_prompt
from .protocol import SINGLE_NOTE_ID, ChartRead, NoteDocument, Pair, PatientDoc, StageResult, TrialDoc, Usage
from .reader import (
    ChartReading,
    Excerpt,
    FactSheet,
    ReaderOutput,
    chart_tokens,
    pair_chart_read,
    plan_reader_calls,
    recorded_reader_result,
    recorded_sheet,
    recorded_terms,
    sheet_key,
    sheet_plan,
    sheet_route,
)
from .routing import SheetRouter
from .staged import decide_pair, held_open, mine_pair, resolved
from .stages import Formalizer
from .value_reuse import ValueReuse

__all__ = [
    "BudgetExhausted",
    "CallCache",
    "ChartRead",
    "ChartReading",
    "Check",
    "ConfigError",
    "CriterionText",
    "DataClass",
    "EGRESS_RULE",
    "ENV_ALLOW",
    "EgressConfig",
    "EgressPolicy",
    "EgressRefused",
    "EndpointClient",
    "EndpointConfig",
    "EndpointError",
    "EndpointPool",
    "Excerpt",
    "FactSheet",
    "Formalizer",
    "Ledger",
    "MINER_BUDGET",
    "MinedValues",
    "MinerBudgetError",
    "NoteDocument",
    "PROMPTS_DIR",
    "Pair",
    "PairCost",
    "PassageConflict",
    "PatientDoc",
    "PlannedCall",
    "PoolMember",
    "REASONS",
    "ReaderOutput",
    "SIDES",
    "SINGLE_NOTE_ID",
    "STUDENT_STAGES",
    "SheetRouter",
    "SourceEgress",
    "SourceError",
    "StageResult",
    "StageTokens",
    "StudentLimits",
    "TokenCounter",
    "TrialDoc",
    "Usage",
    "ValueReuse",
    "apply_limits",
    "as_documents",
    "asked_atoms",
    "assemble",
    "build_request",
    "chart_tokens",
    "check_criterion_output",
    "check_miner_output",
    "compact",
    "core_schema",
    "cost_total",
    "criterion_messages",
    "criterion_outputs",
    "decide_pair",
    "definition_conflicts",
    "derive_limits",
    "estimate_prompt_tokens",
    "failure_reason",
    "held_open",
    "is_loopback",
    "limits_of",
    "load_limits",
    "load_prompt",
    "load_teacher",
    "locate",
    "merge_sides",
    "mine_pair",
    "mine_values",
    "miner_messages",
    "miner_target",
    "normalize_criterion",
    "normalize_ws",
    "open_db",
    "pair_chart_read",
    "pair_cost",
    "paragraph_spans",
    "parse_json",
    "parse_output",
    "plan_for",
    "plan_miner_calls",
    "plan_reader_calls",
    "quote_in_note",
    "qwen25_counter",
    "qwen25_tokenizer_file",
    "recorded_reader_result",
    "recorded_sheet",
    "recorded_terms",
    "redecide",
    "reduce_chart",
    "render_atoms",
    "resolved",
    "sheet_key",
    "sheet_plan",
    "sheet_route",
    "side_atoms",
    "split_pieces",
    "split_trial",
    "stage_prompt",
    "student_limit_keys",
    "with_atom_enum",
]
