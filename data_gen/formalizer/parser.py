"""The trial-parser stage: criteria text -> a checked trial program."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from verdict_core.errors import ProgramError, describe_validation_error
from verdict_core.program import ParsedTrial, Provenance, TrialProgram, check_program

from ..cache import CachedCall
from ..prompt_templates import stage_prompt
from ..protocol import StageResult, TrialDoc
from .checks import Check, compact, core_schema, parse_json

if TYPE_CHECKING:
    from .runtime import Formalizer


def parser_messages(trial: TrialDoc, version: str = "v1") -> list[dict[str, str]]:
    return stage_prompt("parser", version).render(TRIAL_ID=trial.trial_id, TITLE=trial.title or "(untitled)",
                                                  CRITERIA=trial.criteria_text())


def check_parser_output(content: str | None, finish_reason: str | None, trial: TrialDoc, *, model: str, teacher: str,
                        prompt: str, max_tokens: int) -> Check:
    """JSON -> ParsedTrial schema -> check_program -> check_satisfiable. Output: the TrialProgram."""
    obj, problems = parse_json(content, finish_reason, max_tokens)
    if problems:
        return Check(problems)
    try:
        parsed = ParsedTrial.model_validate(obj)
    except ValidationError as e:
        return Check([("schema", p) for p in describe_validation_error(e, "output")])
    try:
        program = check_program(TrialProgram(
            trial_id=trial.trial_id, title=trial.title, **parsed.model_dump(by_alias=True),
            provenance=Provenance(source=f"parser:{model}", details={"teacher": teacher, "prompt": prompt}),
        ))
    except ValidationError as e:  # e.g. a trial id the core does not accept
        return Check([("schema", p) for p in describe_validation_error(e, "program")])
    except ProgramError as e:
        return Check([("undeclared_atom" if "undeclared atom" in p else "program", p) for p in e.problems]
                     or [("program", e.summary)])
    try:
        _check_satisfiable(program)
    except ProgramError as e:
        return Check([("unsatisfiable", p) for p in e.problems] or [("unsatisfiable", e.summary)])
    return Check([], program, compact(parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True)))


async def parse_trial(fz: "Formalizer", trial: TrialDoc) -> StageResult:
    """Criteria text -> checked TrialProgram. Trial text is public: no egress restriction."""
    messages = fz.parser_messages(trial)
    t = fz.endpoint

    def validate(call: CachedCall) -> Check:
        return check_parser_output(call.content, call.finish_reason, trial, model=t.model, teacher=t.name,
                                   prompt=fz.prompt("parser").ident, max_tokens=t.max_tokens.parser)

    return await fz._stage("parser", messages, core_schema("parsed-trial"), "parsed_trial", validate,
                             patient_text=False, data_class="public", ids=f"trial={trial.trial_id}", solver=True)


def _check_satisfiable(program: TrialProgram) -> None:
    from verdict_core.engine import check_satisfiable

    check_satisfiable(program)
