"""The verbalizer (paper appendix A.6): restates the core's decision as prose for clinicians. It
decides nothing: the answer must state the record's decision and no number the record does not
hold. Opt-in (`api.formalizer.verbalizer`); the structured rationale stays the source of truth."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from verdict.core.program import TrialProgram

from .cache import CachedCall
from .checks import Check, compact, parse_output
from .protocol import StageResult, VerbalizerOutput

if TYPE_CHECKING:
    from .runtime import Runtime

_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?")


def _num(x: str) -> float:
    return float(x)


async def verbalize(
    rt: Runtime, program: TrialProgram, patient, decision, *, data_class: str = "private"
) -> StageResult:
    """Restate a Decision for clinicians; output: the rationale text. It may decide nothing."""
    try:
        from verdict.core.rationale import render_markdown

        record = render_markdown(program, patient, decision)
    except ImportError:
        record = decision.canonical_json()
    messages = rt.prompt("verbalizer").render(RECORD=record)
    allowed = {_num(x) for x in _NUMBER.findall(record)}

    def validate(call: CachedCall) -> Check:
        out, problems = parse_output(
            call.content, call.finish_reason, rt.endpoint.max_tokens.verbalizer, VerbalizerOutput
        )
        if out is None:
            return Check(problems)
        if out.decision != decision.decision:
            problems.append(
                ("decision", f"decision is '{out.decision}' but the record says '{decision.decision}'")
            )
        extra = sorted({x for x in _NUMBER.findall(out.rationale) if _num(x) not in allowed})
        if extra:
            problems.append(
                (
                    "unsupported_number",
                    f"the rationale states numbers not in the record: {', '.join(extra[:8])}",
                )
            )
        return Check(problems, out.rationale, compact(out.model_dump(mode="json")))

    return await rt.run_stage(
        "verbalizer",
        messages,
        VerbalizerOutput.model_json_schema(),
        "verbalizer_output",
        validate,
        patient_text=True,
        data_class=data_class,
        ids=f"trial={program.trial_id} patient={patient.patient_id}",
        sensitive=(record,),
    )
