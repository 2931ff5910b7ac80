"""Monitoring: the formalizer up/down gauge from the pool's health checks, over real HTTP, and every
metric the service exports is documented (docs/deploy.md, "Monitoring")."""

from __future__ import annotations

import re

from verdict.data_gen.scripted_server import ScriptedServer
from verdict.serve.metrics import ServiceMetrics

from tests.serve.conftest import start_service
from tests.serve.test_ha import dead_url, pool_config
from tests.support import REPO


def up_gauge(text: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^verdict_formalizer_up\{endpoint="([^"]+)"\} (\S+)$', text, re.M)
    }


def test_the_formalizer_up_gauge_follows_the_pools_health_checks(tmp_path):
    up, dead = ScriptedServer().start(), dead_url()
    svc = start_service(tmp_path / "r", up.url, pool_config([up.url, dead]))
    try:
        with svc.client(None) as probe, svc.client("audit") as audit:
            assert probe.get("/readyz").status_code == 200
            assert up_gauge(audit.get("/metrics").text) == {up.url: 1.0, dead: 0.0}
            up.stop()
            assert probe.get("/readyz").status_code == 503
            assert up_gauge(audit.get("/metrics").text) == {up.url: 0.0, dead: 0.0}
    finally:
        svc.stop()


def test_every_metric_is_documented():
    metrics = ServiceMetrics()
    metrics.watch_formalizers([])
    names = {m.name for m in metrics.registry.collect()}
    docs = (REPO / "docs" / "deploy.md").read_text()
    missing = sorted(n for n in names if f"`{n}" not in docs)
    assert not missing, f"undocumented metrics: {missing}"
    assert "verdict_formalizer_up" in names
