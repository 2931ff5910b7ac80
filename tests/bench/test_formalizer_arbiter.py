"""The bench formalizer backend's opt-in arbiter (the service's stage, paper appendix A.5), against
the scripted OpenAI-compatible server (real HTTP): off by default; on, it re-reads a conflicting pair,
the core decides again, and its calls are in the pair's stages (tokens, cost, model time)."""

import asyncio

import pytest
from verdict.bench.backends import backend_config, make_backend
from verdict.core.program import load_program
from verdict.data_gen.formalizer.protocol import PatientDoc
from verdict.data_gen.scripted_server import Script, ScriptedServer

from tests.data_gen.teacher_data import accepted_result
from tests.serve.test_optional_stages import ARBITER, FIX, PROGRAM, SCRIPT

from . import scenario
from .test_backends import ctx_for, lp


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(Script.model_validate(SCRIPT)) as s:
        yield s


def run_pair(tmp_path, url, **switches):
    pair = lp("P-FIX", "T-ARB")
    ctx = ctx_for(
        tmp_path, [pair], patients={"P-FIX": PatientDoc(patient_id="P-FIX", text=FIX)}, data_class="synthetic"
    )
    ep = scenario.endpoint(url)
    b = make_backend(
        backend_config({"name": "v", "kind": "formalizer", "parser": ep, "miner": ep, **switches}), ctx
    )
    parsed = accepted_result("parser", output=load_program(PROGRAM))

    async def go():
        async def _parsed(*_):  # the parse is not what this test is about
            return parsed

        b.parsed = _parsed
        try:
            return await b.decide(pair, 0)
        finally:
            await b.aclose()

    return asyncio.run(go())


def asked(server) -> int:
    return sum(1 for r in server.requests if ARBITER in str(r.body))


def test_arbiter_is_off_by_default(tmp_path, server):
    cfg = backend_config({"name": "v", "kind": "formalizer", "parser": "x", "miner": "x"})
    assert (cfg.arbiter, cfg.verbalizer) == (False, False)
    before = asked(server)
    r = run_pair(tmp_path, server.url)
    assert asked(server) == before and "arbiter" not in r.stages
    assert r.decision == "eligible"  # the conflict stays set aside


def test_arbiter_on_changes_the_value_and_is_accounted(tmp_path, server):
    before = asked(server)
    r = run_pair(tmp_path, server.url, arbiter=True)
    assert asked(server) - before == 1
    assert r.decision == "ineligible"  # has_asthma overridden to true: severe asthma excludes
    st = r.stages["arbiter"]
    assert st.status == "accepted" and st.attempts == 1 and st.prompt_tokens > 0 and st.cost_usd > 0
