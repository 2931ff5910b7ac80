"""Prometheus metrics of the matching service: one registry per app (tests run several apps in one
process). Labels are route templates, stage names, status codes and outcome words only: never ids
or text from a request, so neither patient text nor unbounded label sets can reach a scrape.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from verdict.data_gen.formalizer import PairCost

STAGES = ("parse", "miner_inclusion", "miner_exclusion", "resolve", "solve", "render", "audit")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (0, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "verdict_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "verdict_request_seconds",
            "HTTP request latency by route template",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "verdict_stage_seconds",
            "latency of one pipeline stage",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "verdict_formalizer_tokens", "tokens used by formalizer calls", ["stage", "kind"], registry=r
        )
        self.trial_cache = Counter(
            "verdict_trial_cache", "trial program lookups by parse-cache result", ["result"], registry=r
        )
        self.errors = Counter("verdict_errors", "failed requests by error code", ["code"], registry=r)
        self.decisions = Counter("verdict_decisions", "decisions made", ["decision"], registry=r)
        self.repairs = Counter(
            "verdict_formalizer_repairs",
            "formalizer outputs that needed the repair attempt",
            ["stage", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge("verdict_matches_in_flight", "matches being computed now", registry=r)
        # Cost per (patient, trial) pair: what a site's GPU spends on a screen grows with these.
        self.pair_calls = Histogram(
            "verdict_pair_model_calls",
            "model calls one match sent (value miner, both sides; the chart reading when this pair paid it)",
            buckets=_COUNT_BUCKETS,
            registry=r,
        )
        self.pair_tokens = Histogram(
            "verdict_pair_tokens",
            "prompt or completion tokens one match sent to a model",
            ["kind"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.chart_readings = Counter(
            "verdict_chart_readings",
            "matches whose patient chart was read once for all trials, by whether this match paid the "
            "reading or reused it",
            ["result"],
            registry=r,
        )

    def observe_pair(self, cost: PairCost) -> None:
        paid = cost.paid()
        self.pair_calls.observe(paid.calls)
        self.pair_tokens.labels("prompt").observe(paid.prompt_tokens)
        self.pair_tokens.labels("completion").observe(paid.completion_tokens)
        if cost.reading is not None:
            self.chart_readings.labels("reused" if cost.reading_reused else "paid").inc()

    def watch_formalizers(self, members) -> None:
        """`verdict_formalizer_up{endpoint}`: 1 while a formalizer server of the pool is up (answered
        its last health check or call), else 0; read from the pool at each scrape. ``members``: the
        pool's members (each with `base_url` and `state`); the label is the configured base URL."""
        self.registry.register(_FormalizerUp(members))

    def watch_solver_pool(self, pool) -> None:
        """Expose the solver pool's lanes at each scrape (verdict.core.solver_pool.PoolStats)."""
        self.registry.register(_SolverPoolCollector(pool))

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.stage_seconds.labels(stage).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _FormalizerUp:
    """A collector: the pool's member states at scrape time (no hook into the pool needed)."""

    def __init__(self, members) -> None:
        self.members = members

    def collect(self):
        g = GaugeMetricFamily(
            "verdict_formalizer_up",
            "1 while a formalizer server is up, else 0 (down or not yet checked)",
            labels=["endpoint"],
        )
        for m in self.members:
            g.add_metric([m.base_url], 1.0 if m.state == "up" else 0.0)
        yield g


class _SolverPoolCollector:
    """The solver pool's processes, jobs and events, read when scraped."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def describe(self):
        return []  # registered without a first collect: the pool may not be started yet

    def collect(self):
        s = self.pool.stats()
        jobs = GaugeMetricFamily(
            "verdict_solver_jobs", "solver jobs by lane and state", labels=["lane", "state"]
        )
        for lane, state, n in (
            ("short", "running", s.short_busy),
            ("short", "queued", s.short_queued),
            ("hard", "running", s.hard_running),
            ("hard", "queued", s.hard_queued),
        ):
            jobs.add_metric([lane, state], n)
        workers = GaugeMetricFamily(
            "verdict_solver_workers", "solver worker processes by lane", labels=["lane"]
        )
        workers.add_metric(["short"], s.short_workers)
        workers.add_metric(["hard"], s.hard_running)
        events = CounterMetricFamily(
            "verdict_solver_events",
            "solver pool events: jobs answered, moved to the hard lane, restarted there, ended at the "
            "time limit, cancelled, lost with a crashed worker; worker processes started",
            labels=["event"],
        )
        for event in ("answered", "promoted", "requeued", "timed_out", "cancelled", "crashed", "started"):
            events.add_metric([event], getattr(s, event))
        yield from (jobs, workers, events)
