"""One serving path with the REAL Qwen2.5 vocabulary: a tiny random Qwen2 carrying the rebuilt
Qwen2.5 tokenizer and chat template (train/tiny.py, never trained), served by the vLLM CPU server.

- the chat template vLLM applies is the one budget.py counts: /tokenize ids and `usage.prompt_tokens`
  equal our count of the same messages (exact budget arithmetic);
- structured outputs compile for both stage schemas (per-criterion parser, value miner with its
  atom enum) and return schema-valid JSON (closing tokens are favoured with logit_bias, so the
  random model closes its strings instead of looping inside one until max_tokens);
- the service's grammar warm-up happens before /readyz says ready, and the first real request
  after it does not pay the one-time grammar setup.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from verdict.data_gen.formalizer import core_schema, with_atom_enum
from verdict.data_gen.formalizer.budget import qwen25_counter, render_chat
from verdict.data_gen.formalizer.client import EndpointClient, build_request
from verdict.data_gen.formalizer.criteria import CriterionText
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.parser import criterion_messages

from tests.fixtures.vllm import vllm_available, vllm_python
from tests.support import need

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CLOSERS = ['"', '"}', '"]', '"}]', "}", "]", "}]", "]}", '"},', "},", "false", "null"]


@pytest.fixture(scope="module")
def real_vocab_server(tmp_path_factory, qwen25_model_dir):
    need(vllm_available(), f"vLLM environment missing ({vllm_python()}): run scripts/setup.sh")
    from verdict.serve.vllm.config import VLLMConfig
    from verdict.serve.vllm.server import VLLMServer

    log = tmp_path_factory.mktemp("vllm-real-vocab") / "vllm.log"
    server = VLLMServer(
        VLLMConfig(
            model=str(qwen25_model_dir),
            dtype="float32",
            max_model_len=4096,
            log_file=str(log),
            ready_timeout_s=600,
        )
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _endpoint(server, **over) -> EndpointConfig:
    return EndpointConfig(
        name="real-vocab",
        base_url=server.base_url,
        model="base",
        structured_output="vllm",
        max_tokens={"parser": 160, "miner_inclusion": 160, "miner_exclusion": 160},
        context_tokens=4096,
        tokenizer="qwen2.5",
        timeout_s=300,
        max_retries=0,
        **over,
    )


def _criterion_messages() -> list[dict[str, str]]:
    return criterion_messages(
        CriterionText(id="inc-1", side="inclusion", text="Age 18 years or older; HbA1c between 7% and 10%")
    )


def test_chat_template_and_prompt_tokens_equal_our_count(real_vocab_server):
    counter = qwen25_counter()
    msgs = _criterion_messages()
    origin = real_vocab_server.base_url.removesuffix("/v1")
    r = httpx.post(
        f"{origin}/tokenize",
        json={"model": "base", "messages": msgs, "add_generation_prompt": True},
        timeout=60,
    )
    r.raise_for_status()
    assert r.json()["tokens"] == counter.encode(render_chat(msgs))  # the same template, the same ids
    t = _endpoint(real_vocab_server)

    async def go():
        c = EndpointClient(t)
        try:
            req = build_request(t, "parser", msgs, None, "x")
            req["max_tokens"] = 1
            return await c.complete(req, carries_patient_text=False)
        finally:
            await c.aclose()

    comp = asyncio.run(go())
    assert comp.prompt_tokens == counter.count_messages(msgs) and not comp.usage_estimated


def test_warm_up_precedes_readiness_and_the_first_request_is_cheap(real_vocab_server, tmp_path):
    from verdict.serve.api_config import ApiConfig
    from verdict.serve.services import Services

    cfg = ApiConfig.model_validate(
        {
            "formalizer": {
                "base_url": real_vocab_server.base_url,
                "parser_model": "base",
                "value_miner_model": "base",
                "warm_up_grammars": True,
                "timeout_s": 300,
            },
            "audit_db": str(tmp_path / "audit.sqlite"),
            "api_keys": str(tmp_path / "keys.json"),
        }
    )

    async def go():
        svc = Services(cfg, real_vocab_server.base_url)
        try:
            t0 = time.perf_counter()
            ready = await svc.health.readiness()
            warm_s = time.perf_counter() - t0
            t = _endpoint(real_vocab_server)
            c = EndpointClient(t)
            try:
                req = build_request(
                    t, "parser", _criterion_messages(), core_schema("parsed-criterion"), "parsed_criterion"
                )
                req["max_tokens"] = 1
                t1 = time.perf_counter()
                await c.complete(req, carries_patient_text=False)
                first_s = time.perf_counter() - t1
            finally:
                await c.aclose()
            return ready, warm_s, first_s
        finally:
            await svc.aclose()

    ready, warm_s, first_s = asyncio.run(go())
    print(
        f"real vocabulary: grammar warm-up + readiness {warm_s:.2f} s, first parser request after it "
        f"{first_s:.2f} s"
    )
    assert ready.ready is True
    assert first_s < warm_s  # the one-time setup was paid by the warm-up, not by the request


def _bias() -> dict[str, float]:
    counter = qwen25_counter()
    ids = {i for s in CLOSERS for i in counter.encode(s) if len(counter.encode(s)) == 1}
    return {str(i): 40.0 for i in ids}


def test_structured_outputs_for_both_stage_schemas_are_schema_valid(real_vocab_server):
    import jsonschema

    names = ["age_years", "hba1c_percent"]
    cases = [
        (_criterion_messages(), core_schema("parsed-criterion"), "parsed_criterion"),
        (
            [
                {"role": "system", "content": "Return the atoms' values as JSON."},
                {"role": "user", "content": "A 58-year-old man, HbA1c 8.1%."},
            ],
            with_atom_enum(core_schema("value-miner"), names),
            "value_miner",
        ),
    ]
    t = _endpoint(real_vocab_server, extra_body={"logit_bias": _bias()})

    async def go():
        c = EndpointClient(t)
        try:
            out = []
            for msgs, schema, name in cases:
                req = build_request(t, "parser", msgs, schema, name)
                out.append(await c.complete(req, carries_patient_text=False))
            return out
        finally:
            await c.aclose()

    for comp, (_, schema, name) in zip(asyncio.run(go()), cases):
        assert comp.finish_reason == "stop", f"{name}: {comp.finish_reason}: {comp.content[:200]}"
        obj = json.loads(comp.content)
        jsonschema.validate(obj, schema)  # valid under the schema (the core's semantic checks come after)
    log = real_vocab_server.log_path.read_text(errors="replace")
    assert "Failed to compile" not in log and "fallback" not in log.lower().replace(
        "falling back to anyof", ""
    )


def test_the_schema_bounds_an_atom_name_so_a_looping_model_must_close_it(real_vocab_server):
    """The parser's atom-name schema (a pattern with a bounded repeat) under vLLM's own xgrammar: a
    model pushed to extend the name forever (logit_bias on 'aaaaaaaa') is made to close it at
    GRAMMAR_MAX_NAME characters, well before max_tokens; with an unbounded pattern it loops until
    max_tokens ('length'). The full parser schema compiles too (the structured-outputs test)."""
    from verdict.core.schemas import GRAMMAR_MAX_NAME as MAX_NAME

    name_schema = core_schema("parsed-criterion")["$defs"]["Atom"]["properties"]["name"]
    schema = {
        "type": "object",
        "properties": {"name": name_schema},
        "required": ["name"],
        "additionalProperties": False,
    }
    loop = qwen25_counter().encode("aaaaaaaa")
    assert len(loop) == 1
    t = _endpoint(real_vocab_server, extra_body={"logit_bias": {str(loop[0]): 100.0}})  # 160 new tokens

    async def go():
        c = EndpointClient(t)
        try:
            return await c.complete(
                build_request(t, "parser", _criterion_messages(), schema, "atom_name"),
                carries_patient_text=False,
            )
        finally:
            await c.aclose()

    comp = asyncio.run(go())
    assert comp.finish_reason == "stop", comp.finish_reason
    name = json.loads(comp.content)["name"]
    assert MAX_NAME - 8 < len(name) <= MAX_NAME
