"""The trial-parser stage, per criterion (paper appendix A.2): the trial's criteria are split
deterministically (`criteria.py`), each is parsed in its own call -> checked -> one repair, and the
outputs are assembled into one checked trial program (`assembly.py`).

A call carries one criterion and its side, never the trial id or title, so the same criterion in
two trials is the same request: the content-addressed call cache answers it once (key: criterion
text + side + prompt version + endpoint/model + schema). A criterion whose output fails its checks
does not sink the trial: the assembly represents it as an open 'confirm at screening' atom.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError
from verdict.core.errors import ProgramError, describe_validation_error
from verdict.core.formula import atoms_in
from verdict.core.program import (
    Cohort,
    Criterion,
    ParsedCriterion,
    ParsedTrial,
    Provenance,
    TrialProgram,
    check_program,
)

from .assembly import assemble
from .cache import CachedCall
from .checks import Check, compact, core_schema, parse_output
from .criteria import CriterionText, Split, split_trial
from .prompt_templates import stage_prompt
from .protocol import StageResult, TrialDoc, Usage

if TYPE_CHECKING:
    from .runtime import Runtime

SCHEMA = "parsed-criterion"
SCHEMA_NAME = "parsed_criterion"
_PROBE_ID = "T"  # trial id of the one-criterion program a call's output is checked as
_PROBE_PATH = re.compile(r"cohorts\[0\]\.(?:inclusion|exclusion)\[0\] '[^']*'\.formula")


def criterion_messages(c: CriterionText, version: str = "v1") -> list[dict[str, str]]:
    return stage_prompt("parser", version).render(SIDE=c.side.capitalize(), CRITERION=c.text)


def criterion_program(c: CriterionText, parsed: ParsedCriterion) -> TrialProgram:
    """The output as a one-criterion program (for the core's checks)."""
    cr = Criterion(id=c.id, text=c.text, formula=parsed.formula)
    cohort = Cohort(id="main", **{c.side: [cr]})
    atoms = [a.model_copy(update={"source_criteria": [c.id]}) for a in parsed.atoms]
    return TrialProgram(trial_id=_PROBE_ID, atoms=atoms, definitions=parsed.definitions, cohorts=[cohort])


def check_criterion_output(
    content: str | None,
    finish_reason: str | None,
    c: CriterionText,
    *,
    max_tokens: int,
    check_satisfiable: Callable[[TrialProgram], None],
) -> Check:
    """JSON -> ParsedCriterion schema -> check_program and check_satisfiable (the caller's engine's)
    on the one-criterion program (in scope). Output: the ParsedCriterion."""
    parsed, problems = parse_output(content, finish_reason, max_tokens, ParsedCriterion)
    if parsed is None:
        return Check(problems)
    out_json = compact(parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True))
    if not parsed.in_scope:
        return Check([], parsed, out_json)
    if not parsed.atoms:  # nothing declared: name what the formula uses (a program needs one atom)
        used = sorted(atoms_in(parsed.formula))
        return Check(
            [("undeclared_atom", f"formula: undeclared atom '{n}'") for n in used]
            or [("program", "formula: an in-scope criterion's formula must use at least one atom")]
        )
    try:
        program = check_program(criterion_program(c, parsed))
    except ValidationError as e:
        return Check([("schema", p) for p in describe_validation_error(e, "output")])
    except ProgramError as e:
        return Check(
            [("undeclared_atom" if "undeclared atom" in p else "program", _local(p)) for p in e.problems]
            or [("program", e.summary)]
        )
    try:
        check_satisfiable(program)
    except ProgramError as e:
        return Check([("unsatisfiable", _local(p)) for p in e.problems] or [("unsatisfiable", e.summary)])
    return Check([], parsed, out_json)


def _local(problem: str) -> str:
    """A core problem about the one-criterion probe program, worded for the criterion."""
    return _PROBE_PATH.sub("formula", problem)


def trial_criteria(fz: Runtime, trial: TrialDoc) -> Split:
    """The trial's criteria, each within the endpoint's parser prompt budget where it can be."""
    budget = fz.prompt_budget("parser")
    if budget is None:
        return split_trial(trial)
    return split_trial(
        trial,
        lambda c: fz.tokens.count_messages(criterion_messages(c, fz.prompts.get("parser", "v1"))) <= budget,
    )


def trial_request_key(fz: Runtime, trial: TrialDoc) -> str:
    """What a parse of this trial depends on, hashed: its id, title and criteria as split, the
    endpoint (model), the prompt and repair templates (version + hash) and the output schema. The
    service keys its trial cache on it."""
    from .cache import canonical_key

    tmpl, repair = fz.prompt("parser"), fz.repair_prompt
    return canonical_key(
        {
            "stage": "parser",
            "endpoint": fz.endpoint.endpoint_id,
            "model": fz.endpoint.model,
            "prompt": f"{tmpl.ident}#{tmpl.sha256}",
            "repair": f"{repair.ident}#{repair.sha256}",
            "schema": canonical_key(core_schema(SCHEMA)),
            "trial_id": trial.trial_id,
            "title": trial.title,
            "criteria": [[c.id, c.side, c.text] for c in trial_criteria(fz, trial).criteria],
        }
    )


async def parse_criterion(
    fz: Runtime,
    c: CriterionText,
    *,
    trial_id: str = "",
) -> StageResult:
    """One criterion -> checked ParsedCriterion (StageResult with `item` = the criterion id)."""
    t = fz.endpoint

    def validate(call: CachedCall) -> Check:
        return check_criterion_output(
            call.content,
            call.finish_reason,
            c,
            max_tokens=t.max_tokens.parser,
            check_satisfiable=fz.engine.check_satisfiable,
        )

    # At most `concurrency` criterion calls of an endpoint wait at once (each holds a budget
    # reservation while it waits): a 40-criterion trial does not reserve 40 worst cases up front.
    async with fz.stage_slots("parser"):
        res = await fz.run_stage(
            "parser",
            criterion_messages(c, fz.prompts.get("parser", "v1")),
            core_schema(SCHEMA),
            SCHEMA_NAME,
            validate,
            patient_text=False,
            data_class="public",
            ids=f"trial={trial_id} criterion={c.id}",
            solver=True,
        )
    return res.model_copy(update={"item": c.id})


async def parse_trial(fz: Runtime, trial: TrialDoc) -> StageResult:
    """Criteria text -> per-criterion calls -> assembled, checked TrialProgram. Trial text is public."""
    t = fz.endpoint
    split = trial_criteria(fz, trial)
    # Every call runs to its end before an endpoint error or a budget stop is raised: the answered
    # ones are cached, so the retry pays only for what is missing.
    done = await asyncio.gather(
        *(parse_criterion(fz, c, trial_id=trial.trial_id) for c in split.criteria),
        return_exceptions=True,
    )
    errors = [r for r in done if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    calls: list[StageResult] = list(done)  # type: ignore[arg-type]
    usage = Usage()
    for r in calls:
        usage = usage.add(r.usage)
    outputs = {r.item: r.output for r in calls if r.accepted}
    failures = {r.item: r.reason or "rejected" for r in calls if not r.accepted}
    prompt = fz.prompt("parser").ident
    asm = await asyncio.to_thread(
        assemble,
        trial.trial_id,
        trial.title,
        split.criteria,
        outputs,
        failures,
        provenance=Provenance(source=f"parser:{t.model}", details={"teacher": t.name, "prompt": prompt}),
        check_satisfiable=fz.engine.check_satisfiable,
    )
    report = dict(
        asm.report,
        headings_dropped=len(split.headings),
        oversize=split.oversize,
        split_groups=split.split_groups,
    )
    if not split.criteria:
        asm.problems = [("empty", "no criteria found in the trial text")]
    common = dict(
        stage="parser",
        teacher=t.name,
        model=t.model,
        prompt_version=prompt,
        messages=[],
        calls=calls,
        usage=usage,
        assembly=report,
    )
    if asm.program is None:
        check = Check(asm.problems)
        return StageResult(status="rejected", reason=check.reason, problems=check.messages, **common)
    program = asm.program
    parsed = ParsedTrial.model_validate(program.model_dump(include={"atoms", "definitions", "cohorts"}))
    return StageResult(
        status="accepted",
        output=program,
        output_json=compact(parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True)),
        **common,
    )
