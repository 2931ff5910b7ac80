"""Grammar warm-up: with `warm_up_grammars`, readiness stays false until every stage's structured-
output schema has been sent once to the formalizer (scripted OpenAI-compatible server over real
HTTP); a failed warm-up is retried at the next check, never fatal."""

from __future__ import annotations

import asyncio
import json

from verdict.data_gen.scripted_server import Script, ScriptedServer
from verdict.data_gen.scripted_server import ScriptedResponse as R
from verdict.serve.api_config import ApiConfig
from verdict.serve.services import Services


def _service(tmp_path, url: str, warm: bool = True) -> Services:
    cfg = ApiConfig.model_validate(
        {
            "formalizer": {
                "base_url": url,
                "parser_model": "scripted",
                "value_miner_model": "scripted",
                "warm_up_grammars": warm,
            },
            "audit_db": str(tmp_path / "audit.sqlite"),
            "api_keys": str(tmp_path / "keys.json"),
        }
    )
    return Services(cfg, url)


def _schemas(srv: ScriptedServer) -> list[str]:
    """Which stage schema each request carried (by its required top-level keys)."""
    out = []
    for r in srv.requests:
        schema = (r.body.get("structured_outputs") or {}).get("json") or {}
        out.append("miner" if "values" in schema.get("properties", {}) else "parser" if schema else "none")
    return out


def test_not_ready_until_both_stage_grammars_are_warm_and_a_failure_is_retried(tmp_path):
    async def go():
        with ScriptedServer(Script(default=R(fault="status", status=500))) as srv:
            svc = _service(tmp_path, srv.url)
            try:
                r = await svc.health.readiness()  # the server is up, but the warm-up request fails
                assert r.ready is False and "warming up" in r.reason and "HTTP 500" in r.reason
                assert len(srv.requests) >= 1
                srv.set_script(Script(default=R(content={"in_scope": False})))
                srv.reset()
                r = await svc.health.readiness()  # retried: now warm
                assert r.ready is True and r.reason is None
                assert sorted(_schemas(srv)) == ["miner", "parser"]
                body = srv.requests[0].body
                assert body["max_tokens"] == 1 and "Patient note" not in json.dumps(body)
                before = len(srv.requests)
                assert (await svc.health.readiness()).ready is True
                assert len(srv.requests) == before  # warmed once per server
            finally:
                await svc.aclose()

    asyncio.run(go())


def test_a_readiness_check_during_the_warm_up_does_not_wait_for_it(tmp_path):
    async def go():
        with ScriptedServer(Script(default=R(content={"in_scope": False}, latency_s=1.0))) as srv:
            svc = _service(tmp_path, srv.url)
            try:
                await svc.formalizers.pool.check_all()
                warming = asyncio.create_task(svc.grammars.warm())
                await asyncio.sleep(0.2)
                r = await svc.health.readiness()
                assert r.ready is False and r.reason == "warming up the structured-output grammars"
                assert await warming is None
                assert (await svc.health.readiness()).ready is True
            finally:
                await svc.aclose()

    asyncio.run(go())


def test_without_the_setting_nothing_is_sent_before_ready(tmp_path):
    async def go():
        with ScriptedServer(Script(default=R(fault="status", status=500))) as srv:
            svc = _service(tmp_path, srv.url, warm=False)
            try:
                assert (await svc.health.readiness()).ready is True and srv.requests == []
            finally:
                await svc.aclose()

    asyncio.run(go())
