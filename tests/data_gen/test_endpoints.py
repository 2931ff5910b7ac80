"""The endpoint pool against scripted servers over real HTTP: balancing, failover, health checks."""

import asyncio
import time

import pytest
from verdict.data_gen.formalizer.client import build_request
from verdict.data_gen.formalizer.egress import EgressPolicy
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.endpoints import ERRORS_IN_A_ROW, EndpointPool
from verdict.data_gen.formalizer.errors import EgressRefused, EndpointError
from verdict.data_gen.scripted_server import Rule, Script, ScriptedServer
from verdict.data_gen.scripted_server import ScriptedResponse as R
from verdict.serve.vllm.server import free_port

MESSAGES = [{"role": "user", "content": "hello"}]


def teacher(url: str, **over) -> EndpointConfig:
    return EndpointConfig(
        **{"name": "t", "base_url": url, "model": "scripted", "timeout_s": 5, "max_retries": 0, **over}
    )


def pool(urls, **kw) -> EndpointPool:
    kw.setdefault("required_models", ["scripted"])
    return EndpointPool(teacher(urls[0]), urls, egress=EgressPolicy(), **kw)


def request(text: str = "hello") -> dict:
    messages = [{"role": "user", "content": text}]
    return build_request(teacher("http://127.0.0.1:1/v1"), "parser", messages, None, "x")


async def send(p: EndpointPool, text: str = "hello"):
    return await p.complete(request(text), carries_patient_text=False)


def serving(*responses, latency: float = 0.0) -> ScriptedServer:
    return ScriptedServer(
        Script(rules=[Rule(responses=list(responses) or [R(content="ok")])], default_latency_s=latency)
    ).start()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def test_requests_go_to_the_least_busy_endpoint():
    a, b = serving(latency=0.3), serving(latency=0.3)
    try:

        async def go():
            p = pool([a.url, b.url])
            try:
                return await asyncio.gather(*(send(p, f"q{i}") for i in range(10)))
            finally:
                await p.aclose()

        out = asyncio.run(go())
        assert [c.content for c in out] == ["ok"] * 10
        assert len(a.requests) == 5 and len(b.requests) == 5  # least in flight: strict alternation
    finally:
        a.stop(), b.stop()


def test_a_dead_endpoint_fails_over_once_then_is_skipped():
    b = serving()
    try:

        async def go():
            p = pool([dead_url(), b.url])
            try:
                out = [await send(p, f"q{i}") for i in range(4)]
                return out, p.failovers, p.members[0].state, p.members[0].reason
            finally:
                await p.aclose()

        out, failovers, state, reason = asyncio.run(go())
        assert [c.content for c in out] == ["ok"] * 4 and len(b.requests) == 4
        assert failovers == 1 and state == "down" and "connection failed" in reason
    finally:
        b.stop()


@pytest.mark.parametrize("status, state", [(503, "down"), (500, "unknown")])  # unknown: usable
def test_a_5xx_fails_over_and_an_unavailable_endpoint_is_marked_down(status, state):
    """503: the server says it is unavailable. 500: maybe the one request, so it stays up for the
    others (until ERRORS_IN_A_ROW requests in a row got a 5xx)."""
    a, b = serving(R(fault="status", status=status)), serving()
    try:

        async def go():
            p = pool([a.url, b.url])
            try:
                c = await send(p)
                return c, p.failovers, [m.state for m in p.members]
            finally:
                await p.aclose()

        c, failovers, states = asyncio.run(go())
        assert c.content == "ok" and failovers == 1 and states == [state, "up"]
        assert a.keys() == b.keys() and len(a.keys()) == 1  # the identical request body
    finally:
        a.stop(), b.stop()


def test_a_timeout_fails_over():
    a, b = serving(R(fault="timeout")), serving()
    try:

        async def go():
            p = EndpointPool(
                teacher(a.url, timeout_s=0.3),
                [a.url, b.url],
                required_models=["scripted"],
                egress=EgressPolicy(),
            )
            try:
                return await send(p), p.members[0].state
            finally:
                await p.aclose()

        c, state = asyncio.run(go())
        assert c.content == "ok" and state == "down"
    finally:
        a.stop(), b.stop()


def test_a_request_the_server_refuses_is_not_sent_elsewhere():
    a, b = serving(R(fault="status", status=400, message="bad request")), serving()
    try:

        async def go():
            p = pool([a.url, b.url])
            try:
                with pytest.raises(EndpointError) as e:
                    await send(p)
                return e.value, [m.state for m in p.members]
            finally:
                await p.aclose()

        err, states = asyncio.run(go())
        assert err.status == 400 and not err.retryable and states[0] != "down" and b.requests == []
    finally:
        a.stop(), b.stop()


def test_no_server_message_reaches_the_pool_errors_or_states():
    echo = "patient Zyxwvut Quorlin MRN-99887766"  # servers echo requests in their errors
    a = serving(R(fault="status", status=500, message=echo))
    b = serving(R(fault="status", status=503, message=echo))
    try:

        async def go():
            p = pool([a.url, b.url])
            try:
                with pytest.raises(EndpointError) as e:
                    await send(p)
                return str(e.value), [m.reason for m in p.members]
            finally:
                await p.aclose()

        message, reasons = asyncio.run(go())
        assert (
            reasons == [None, "HTTP 503"] and "HTTP 500" in message and "HTTP 503" in message
        )  # a: still up
        assert "Quorlin" not in message + "".join(r or "" for r in reasons)
    finally:
        a.stop(), b.stop()


def test_none_left_is_a_retryable_error():
    async def go():
        p = pool([dead_url(), dead_url()])
        try:
            with pytest.raises(EndpointError) as first:
                await send(p)
            with pytest.raises(EndpointError) as later:
                await send(p)
            return first.value, later.value
        finally:
            await p.aclose()

    first, later = asyncio.run(go())
    assert first.retryable and "every formalizer endpoint failed (2 tried)" in str(first)
    assert later.retryable and "no formalizer endpoint available" in str(later)


def test_a_down_endpoint_comes_back_through_the_background_check():
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    b = serving()
    a: ScriptedServer | None = None
    try:

        async def go():
            nonlocal a
            p = pool([url, b.url], check_interval_s=0.2)
            try:
                await send(p)
                assert p.members[0].state == "down"
                a = ScriptedServer(Script(rules=[Rule(responses=[R(content="from a")])]), port=port).start()
                deadline = time.monotonic() + 5
                while p.members[0].state != "up" and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert p.members[0].state == "up" and p.members[0].reason is None
                return [(await send(p, f"after{i}")).content for i in range(2)]
            finally:
                await p.aclose()

        contents = asyncio.run(go())
        assert "from a" in contents
    finally:
        b.stop()
        if a is not None:
            a.stop()


def test_health_check_needs_every_required_model():
    a = serving()
    try:

        async def go():
            p = pool([a.url], required_models=["scripted", "value_miner"])
            try:
                return (await p.check_all())[0]
            finally:
                await p.aclose()

        m = asyncio.run(go())
        assert m.state == "down" and m.reason == "lacks value_miner" and m.models == ["scripted"]
    finally:
        a.stop()


def test_a_lone_endpoint_that_is_back_is_used_at_once():
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"

    async def go():
        p = pool([url], check_interval_s=3600)
        try:
            with pytest.raises(EndpointError):
                await send(p)
            await asyncio.sleep(1.05)  # past the one-check-a-second bound
            with ScriptedServer(Script(rules=[Rule(responses=[R(content="back")])]), port=port):
                return (await send(p)).content
        finally:
            await p.aclose()

    assert asyncio.run(go()) == "back"


def test_egress_is_checked_for_every_endpoint():
    p = EndpointPool(
        teacher("http://127.0.0.1:9/v1"),
        ["http://127.0.0.1:9/v1", "http://gpu02.example.org/v1"],
        required_models=["m"],
        egress=EgressPolicy(),
    )
    with pytest.raises(EgressRefused, match="gpu02.example.org"):
        p.check_egress(carries_patient_text=True, data_class="private", what="x")
    p.check_egress(carries_patient_text=False, data_class="private", what="x")


def test_the_same_url_twice_is_refused():
    from verdict.data_gen.formalizer.errors import ConfigError

    with pytest.raises(ConfigError, match="twice"):
        pool(["http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1/"])


def bad_grammar_server() -> ScriptedServer:
    """A server that answers 500 to prompts containing "bad grammar" (vLLM does when a request's
    grammar fails to compile), and "ok" to the rest."""
    return ScriptedServer(
        Script(
            rules=[Rule(match={"contains": ["bad grammar"]}, responses=[R(fault="status", status=500)])],
            default=R(content="ok"),
        )
    ).start()


def test_request_level_500s_never_take_a_lone_endpoint_down():
    """Issue 22.9: 500s to several prompts of one batch, at once, on the only endpoint: those requests
    fail, the endpoint stays up and the healthy requests are served at once (marked down, they would
    get 503 until its next health check)."""
    srv = bad_grammar_server()
    try:

        async def go():
            p = pool([srv.url])
            try:
                await p.check_all()
                bad = await asyncio.gather(
                    *(send(p, f"bad grammar {i}") for i in range(ERRORS_IN_A_ROW + 2)), return_exceptions=True
                )
                state = p.members[0].state
                return bad, state, (await send(p, "fine")).content
            finally:
                await p.aclose()

        bad, state, content = asyncio.run(go())
        assert all(isinstance(e, EndpointError) and e.status == 500 for e in bad), bad
        assert state == "up" and content == "ok"
    finally:
        srv.stop()


def test_a_request_every_endpoint_fails_alike_is_no_endpoints_fault():
    """Two endpoints each answering 500 to the same prompts: the prompts are at fault, both stay up."""
    a, b = bad_grammar_server(), bad_grammar_server()
    try:

        async def go():
            p = pool([a.url, b.url])
            try:
                for i in range(ERRORS_IN_A_ROW + 1):
                    with pytest.raises(EndpointError, match="every formalizer endpoint failed"):
                        await send(p, f"bad grammar {i}")
                return [m.state for m in p.members], (await send(p, "fine")).content
            finally:
                await p.aclose()

        states, content = asyncio.run(go())
        assert "down" not in states and content == "ok"
        assert len(a.requests) + len(b.requests) == 2 * (ERRORS_IN_A_ROW + 1) + 1  # each prompt on both
    finally:
        a.stop(), b.stop()


def test_in_a_pool_500s_count_against_an_endpoint_over_distinct_requests_only():
    """One request resent however often is one request's error; 500s to ERRORS_IN_A_ROW distinct
    requests that another endpoint serves mark the endpoint down."""
    a = ScriptedServer(
        Script(
            rules=[Rule(match={"contains": ["warm"]}, responses=[R(content="ok")])],
            default=R(fault="status", status=500),
        )
    ).start()
    b = serving()
    try:

        async def go():
            p = pool([a.url, b.url])
            try:
                await send(p, "warm")  # a is up: with both up, each request tries a first (list order)
                for _ in range(ERRORS_IN_A_ROW + 1):
                    assert (await send(p, "the same prompt")).content == "ok"  # failed over to b
                same = p.members[0].state
                for i in range(ERRORS_IN_A_ROW):
                    assert (await send(p, f"prompt {i}")).content == "ok"
                return same, p.members[0].state, p.members[0].reason
            finally:
                await p.aclose()

        same, distinct, reason = asyncio.run(go())
        assert same == "up" and distinct == "down" and reason.startswith("HTTP 500 on ")
        assert len(a.requests) == 1 + ERRORS_IN_A_ROW + 1 + ERRORS_IN_A_ROW - 1  # down before the last
    finally:
        a.stop(), b.stop()


def test_the_last_usable_endpoint_is_not_marked_down_by_request_level_500s():
    """A pool whose other endpoint is down is a lone endpoint for now: 500s to distinct prompts do
    not take the last one away (its healthy requests would get 503)."""
    srv = bad_grammar_server()
    try:

        async def go():
            p = pool([dead_url(), srv.url], check_interval_s=3600)
            try:
                await p.check_all()
                for i in range(ERRORS_IN_A_ROW + 1):
                    with pytest.raises(EndpointError):
                        await send(p, f"bad grammar {i}")
                return [m.state for m in p.members], (await send(p, "fine")).content
            finally:
                await p.aclose()

        states, content = asyncio.run(go())
        assert states == ["down", "up"] and content == "ok"
    finally:
        srv.stop()
