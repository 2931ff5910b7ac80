"""Readiness: ready when at least one formalizer server lists both adapters (and, with
`warm_up_grammars`, has its grammars warm); each server's state is listed."""

from __future__ import annotations

from ..egress_check import origin_of
from ..formalizers import Formalizers
from ..grammar_warm_up import GrammarWarmUp
from ..vllm.server import exit_note
from .protocol import EndpointStatus, Readiness


class HealthService:
    def __init__(self, formalizers: Formalizers, grammars: GrammarWarmUp):
        self.formalizers = formalizers
        self.grammars = grammars

    async def readiness(self) -> Readiness:
        f = self.formalizers
        wanted = f.wanted
        members = await f.pool.check_all()
        states = []
        for m in members:
            # A vLLM this process started and saw die says how it ended (e.g. killed by SIGKILL).
            reason = (exit_note(m.base_url) or m.reason) if m.state == "down" else m.reason
            states.append(
                EndpointStatus(
                    endpoint=origin_of(m.base_url),
                    state=m.state,
                    reason=reason,
                    models=m.models,
                    in_flight=m.in_flight,
                    failures=m.failures,
                )
            )
            f.note_base_model(m)
        up = [m for m in members if m.state == "up"]
        listed = sorted({x for m in (up or members) for x in m.models}, key=lambda x: x)
        missing = [] if up else [w for w in wanted if w not in listed]
        reason = None
        if not up:
            reason = "; ".join(f"{st.endpoint}: {st.reason}" for st in states)
            reason = ("formalizer " if len(states) == 1 else "no formalizer endpoint is ready: ") + reason
        elif self.grammars.enabled:
            # Ready only once a server's grammars are warm; a check during the warm-up does not wait.
            if not any(self.grammars.is_warm(m) for m in up) and not self.grammars.busy:
                await self.grammars.warm()
            up = [m for m in up if self.grammars.is_warm(m)]
            if not up:
                problem = self.grammars.problem
                reason = "warming up the structured-output grammars" + (
                    f" (last attempt: {problem})" if problem else ""
                )
        return Readiness(
            ready=bool(up),
            formalizer=f.label,
            models=listed,
            missing=missing,
            reason=reason,
            endpoints=states,
        )
