"""The endpoint client against the scripted server over real HTTP: retries, pacing, dialects."""

import asyncio
import time

import pytest
from verdict.data_gen.formalizer.client import EndpointClient, build_request, quotes_any
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.errors import ConfigError, EndpointError
from verdict.data_gen.scripted_server import Rule, Script
from verdict.data_gen.scripted_server import ScriptedResponse as R

MESSAGES = [{"role": "user", "content": "hello"}]
NOTE = "A 58-year-old woman presents with episodic pressing chest pain radiating to the back."


def teacher(url, **over):
    cfg = dict(
        name="t", base_url=url, model="m", timeout_s=5, backoff_base_s=0.01, backoff_max_s=0.05, max_retries=3
    )
    cfg.update(over)
    return EndpointConfig(**cfg)


def call(t, request=None, **kw):
    async def go():
        c = EndpointClient(t, seed=0)
        try:
            return await c.complete(
                request or build_request(t, "parser", MESSAGES, None, "x"), carries_patient_text=False, **kw
            ), c.requests_sent
        finally:
            await c.aclose()

    return asyncio.run(go())


def script(*responses, **kw):
    return Script(rules=[Rule(responses=list(responses))], **kw)


def test_429_honours_retry_after(scripted_server):
    scripted_server.set_script(script(R(fault="status", status=429, retry_after=0.4), R(content="ok")))
    t0 = time.monotonic()
    comp, sent = call(teacher(scripted_server.url))
    assert comp.content == "ok" and comp.attempts == 2 and sent == 2
    assert time.monotonic() - t0 >= 0.4  # waited as told, not the 10 ms backoff
    # each start is recorded before that request's answer goes out (its end, after: it may lag the
    # client's retry), so the second starts at least the 0.4 s after the first
    first, second = scripted_server.requests
    assert second.started - first.started >= 0.4


@pytest.mark.parametrize(
    "fault",
    [
        R(fault="status", status=500),
        R(fault="status", status=503),
        R(fault="malformed_body"),
        R(fault="cut_body"),
    ],
)
def test_transient_failures_are_retried(scripted_server, fault):
    scripted_server.set_script(script(fault, fault, R(content="fine")))
    comp, sent = call(teacher(scripted_server.url))
    assert comp.content == "fine" and comp.attempts == 3 and sent == 3
    assert [r.kind for r in scripted_server.requests] == [fault.fault] * 2 + ["ok"]


def test_timeout_is_retried(scripted_server):
    scripted_server.set_script(script(R(fault="timeout"), R(content="late but fine"), timeout_s=3))
    t0 = time.monotonic()
    comp, sent = call(teacher(scripted_server.url, timeout_s=0.5))
    assert comp.content == "late but fine" and sent == 2
    assert 0.5 <= time.monotonic() - t0 < 3


def test_retries_run_out_with_a_clear_error(scripted_server):
    scripted_server.set_script(script(R(fault="status", status=500)))
    with pytest.raises(EndpointError) as e:
        call(teacher(scripted_server.url, max_retries=2))
    assert e.value.status == 500 and "after 3 attempts" in str(e.value) and "HTTP 500" in str(e.value)
    assert len(scripted_server.requests) == 3


def test_client_errors_are_not_retried(scripted_server):
    scripted_server.set_script(
        script(R(fault="status", status=400, message="bad request: max_tokens too large"))
    )
    with pytest.raises(EndpointError) as e:
        call(teacher(scripted_server.url))
    assert e.value.status == 400 and not e.value.retryable and "max_tokens too large" in str(e.value)
    assert len(scripted_server.requests) == 1


def test_server_message_quoting_the_request_is_withheld(scripted_server):
    echo = f"Invalid input: '{NOTE}' is too long"
    scripted_server.set_script(script(R(fault="status", status=400, message=echo)))
    with pytest.raises(EndpointError) as e:
        call(teacher(scripted_server.url), sensitive=(NOTE,))
    assert "withheld" in str(e.value) and "chest pain" not in str(e.value)


def test_quotes_any():
    assert quotes_any(f"xx {NOTE[10:40]} yy", (NOTE,))
    assert not quotes_any("max_tokens must be <= 4096", (NOTE,))


def test_concurrency_is_bounded(scripted_server):
    scripted_server.set_script(script(R(content="x", latency_s=0.2)))
    t = teacher(scripted_server.url, concurrency=3)

    async def go():
        c = EndpointClient(t)
        try:
            req = build_request(t, "parser", MESSAGES, None, "x")
            await asyncio.gather(*(c.complete(req, carries_patient_text=False) for _ in range(9)))
        finally:
            await c.aclose()

    t0 = time.monotonic()
    asyncio.run(go())
    assert scripted_server.peak_in_flight == 3
    assert time.monotonic() - t0 >= 0.6  # 9 calls, 3 at a time, 0.2 s each


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_structured_output_dialects(scripted_server):
    scripted_server.set_script(script(R(content='{"a": 1}')))
    for mode in ("json_schema", "vllm", "json_object", "none"):
        t = teacher(scripted_server.url, structured_output=mode)
        call(t, build_request(t, "parser", MESSAGES, SCHEMA, "thing"))
    bodies = [r.body for r in scripted_server.requests]
    assert bodies[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": SCHEMA, "strict": False},
    }
    assert bodies[1]["structured_outputs"] == {"json": SCHEMA} and "response_format" not in bodies[1]
    assert bodies[2]["response_format"] == {"type": "json_object"}
    assert "response_format" not in bodies[3] and "structured_outputs" not in bodies[3]
    assert not any("guided_json" in b for b in bodies)


def test_reasoning_model_parameters(scripted_server):
    scripted_server.set_script(script(R(content="x")))
    t = teacher(
        scripted_server.url,
        temperature=None,
        max_tokens_param="max_completion_tokens",
        max_tokens={"parser": 777},
        extra_params={"reasoning_effort": "minimal", "vendor_knob": 3},
    )
    call(t)
    body = scripted_server.requests[0].body
    assert "temperature" not in body and "max_tokens" not in body
    assert body["max_completion_tokens"] == 777
    assert body["reasoning_effort"] == "minimal" and body["vendor_knob"] == 3


def test_missing_api_key_is_named_and_nothing_is_sent(scripted_server, monkeypatch):
    monkeypatch.delenv("VERDICT_TEST_KEY", raising=False)
    scripted_server.set_script(script(R(content="x")))
    with pytest.raises(ConfigError, match="VERDICT_TEST_KEY"):
        call(teacher(scripted_server.url, api_key_env="VERDICT_TEST_KEY"))
    assert scripted_server.connections == 0
    monkeypatch.setenv("VERDICT_TEST_KEY", "sk-test")
    call(teacher(scripted_server.url, api_key_env="VERDICT_TEST_KEY"))
    assert len(scripted_server.requests) == 1


def test_usage_is_reported(scripted_server):
    scripted_server.set_script(script(R(content="x", prompt_tokens=123, completion_tokens=45)))
    comp, _ = call(teacher(scripted_server.url))
    assert (comp.prompt_tokens, comp.completion_tokens, comp.usage_estimated) == (123, 45, False)
