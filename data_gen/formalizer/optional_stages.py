"""The opt-in arbiter stage's shared part (paper appendix A.5), used by the service
(serve/optional_stages.py) and the bench formalizer backend, so both ask it on the same atoms and
apply its overrides the same way."""

from __future__ import annotations

import json


def definition_conflicts(decision) -> list:
    """The facts the core set aside because they contradict the program's definitional constraints:
    the arbiter is asked only when there are some."""
    return [c for c in decision.conflicts if c.source == "definitions"]


async def redecide(adecide, program, patient, res):
    """The decision again with the arbiter's accepted overrides (the engine's own `arbiter=` hook;
    `adecide`: an async `Engine.decide`, e.g. the solver pool's), and the applied overrides with
    their evidence; None when the arbiter found no faithful correction (the solver result stands)."""
    from verdict.core.engine import FixedOverrides

    if not res.output:
        return None, []
    said = json.loads(res.output_json or "{}").get("overrides", [])
    again = await adecide(program, patient, None, FixedOverrides(tuple(res.output)))
    evidence = {o.get("atom"): o.get("evidence", "") for o in said}
    applied = [
        {"atom": o.atom, "value": o.value, "evidence": evidence.get(o.atom, ""), "reason": o.reason}
        for o in again.overrides
    ]
    return again, applied
