"""Several OpenAI-compatible endpoints serving the same models (one vLLM per GPU or node) behind one
client with `EndpointClient`'s interface, so a `Formalizer` takes it as its `client`.

    pool = EndpointPool(teacher, ["http://gpu01:8011/v1", "http://gpu02:8011/v1"],
                        required_models=["parser", "value_miner"], egress=egress)
    fz = Formalizer(teacher, client=pool)

Load balancing: each request goes to the healthy endpoint with the fewest requests in flight.
Failover: a connection error, timeout or 5xx sends the same request (requests are idempotent) once
more to another healthy endpoint. Failures that are the endpoint's (no answer, a malformed body, 502,
503 or 504) mark it down. Another 5xx (a 500) may be the one request's (vLLM answers 500 when a
request's grammar fails to compile): it marks an endpoint down only in a pool of several, and only
when ERRORS_IN_A_ROW distinct requests got one there since its last success while no other endpoint
failed them too; a lone endpoint is never marked down for it (there is nowhere else to send the
others, and its healthy requests would get 503). When none is left the error is retryable (the
service answers 503 + Retry-After). A down endpoint is skipped until a background check of its
`/models` lists every required model again. Endpoints never seen failing are tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from .client import Completion, EndpointClient
from .egress import EgressPolicy
from .endpoint_config import EndpointConfig
from .errors import ConfigError, EndpointError

log = logging.getLogger("verdict.data_gen.formalizer.endpoints")

State = Literal["unknown", "up", "down"]


@dataclass
class PoolMember:
    """One endpoint of the pool and what the pool knows about it."""

    base_url: str
    client: EndpointClient
    state: State = "unknown"
    reason: str | None = None  # why it is down, or what it lacks
    models: list[str] = field(default_factory=list)
    parents: dict[str, str] = field(default_factory=dict)  # adapter -> base model, as /models lists them
    in_flight: int = 0
    failures: int = 0
    # digests of the distinct requests answered with a request-level 5xx since its last success
    failed_requests: set[str] = field(default_factory=set)
    checked_at: float | None = None  # time.time() of the last health check

    @property
    def usable(self) -> bool:
        return self.state != "down"


OWN_WORDS = ("no answer within", "connection failed", "malformed response body")


def failure_reason(e: EndpointError) -> str:
    """What went wrong, in the client's own words only: a server's message can echo the request
    (patient text), and these reasons reach logs and the unauthenticated /readyz."""
    if e.status is not None:
        return f"HTTP {e.status}"
    tail = e.summary.rsplit(": ", 1)[-1]
    return tail if tail.startswith(OWN_WORDS) else "failed"


# 5xx that say the server (or the gateway before it) is unavailable; any other 5xx may be about the
# one request, so such answers count against an endpoint only over ERRORS_IN_A_ROW distinct requests
# (e.g. an engine that died while its API still answers /models): one bad request, however often it
# is sent, never takes the endpoint from the others.
_UNAVAILABLE = {502, 503, 504}
ERRORS_IN_A_ROW = 3


def endpoint_level(e: EndpointError) -> bool:
    """The endpoint itself is unwell, whatever was asked: no (well-formed) answer, or unavailable."""
    return e.retryable and (e.status is None or e.status in _UNAVAILABLE)


def request_level_5xx(e: EndpointError) -> bool:
    """A server error that may be about this one request (e.g. a 500 on one prompt)."""
    return e.retryable and e.status is not None and e.status >= 500 and e.status not in _UNAVAILABLE


def request_digest(request: dict[str, Any]) -> str:
    """Which request this was, to count distinct ones (a digest: the request holds patient text)."""
    return hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()


class EndpointPool:
    """Health-checked endpoints with least-in-flight balancing and one failover per request."""

    def __init__(
        self,
        teacher: EndpointConfig,
        base_urls: list[str],
        *,
        required_models: list[str],
        egress: EgressPolicy | None = None,
        check_interval_s: float = 5.0,
        check_timeout_s: float = 3.0,
    ):
        if not base_urls:
            raise ConfigError("an endpoint pool needs at least one base URL")
        if len(set(u.rstrip("/") for u in base_urls)) != len(base_urls):
            raise ConfigError(f"endpoint pool: the same base URL is listed twice ({base_urls})")
        self.teacher = teacher
        self.egress = egress if egress is not None else EgressPolicy.from_config()
        self.required_models = list(required_models)
        self.check_interval_s = check_interval_s
        self.check_timeout_s = check_timeout_s
        self.members = [
            PoolMember(
                base_url=u.rstrip("/"),
                client=EndpointClient(
                    teacher.model_copy(update={"base_url": u.rstrip("/")}), egress=self.egress
                ),
            )
            for u in base_urls
        ]
        self.failovers = 0  # requests sent again to another endpoint after a failure
        self._monitor: asyncio.Task | None = None
        self._tls = None  # the health checks' TLS context: loading the CA bundle costs ~20 ms a time

    # -- the EndpointClient interface --------------------------------------------------------------
    @property
    def requests_sent(self) -> int:
        return sum(m.client.requests_sent for m in self.members)

    def check_egress(self, *, carries_patient_text: bool, data_class: str, what: str) -> None:
        """Every endpoint must be allowed: a failover may send the request to any of them."""
        for m in self.members:
            m.client.check_egress(carries_patient_text=carries_patient_text, data_class=data_class, what=what)

    async def complete(
        self,
        request: dict[str, Any],
        *,
        carries_patient_text: bool,
        data_class: str = "private",
        what: str = "request",
        sensitive: tuple[str, ...] = (),
        request_id: str | None = None,
    ) -> Completion:
        self._ensure_monitor()
        tried: list[PoolMember] = []
        failed: list[str] = []  # "URL: reason" per failed attempt
        last: EndpointError | None = None
        answered_5xx: list[tuple[PoolMember, str]] = []  # who answered it a request-level 5xx, and how
        for _ in range(2):  # the first choice, then one failover
            member = self._pick(exclude=tried)
            if member is None and not tried:
                member = await self._recheck_down()
            if member is None:
                break
            if tried:
                self.failovers += 1
                log.warning("failover: %s -> %s", tried[-1].base_url, member.base_url)
            tried.append(member)
            member.in_flight += 1
            try:
                comp = await member.client.complete(
                    request,
                    carries_patient_text=carries_patient_text,
                    data_class=data_class,
                    what=what,
                    sensitive=sensitive,
                    request_id=request_id,
                )
            except EndpointError as e:
                if not e.retryable:
                    raise  # the request itself is at fault: another endpoint would refuse it too
                last = e
                failed.append(f"{member.base_url}: {failure_reason(e)}")
                if endpoint_level(e):
                    self._mark_down(member, failure_reason(e))
                elif request_level_5xx(e):
                    answered_5xx.append((member, failure_reason(e)))
                continue
            finally:
                member.in_flight -= 1
            member.failed_requests.clear()
            if member.state == "unknown":
                member.state = "up"
            self._blame(answered_5xx, request)
            return comp
        if len(answered_5xx) < 2:  # two endpoints failing it alike: the request's fault, no endpoint's
            self._blame(answered_5xx, request)
        if last is not None and len(tried) == len(self.members):
            raise EndpointError(
                f"every formalizer endpoint failed ({len(tried)} tried): {'; '.join(failed)}",
                status=last.status,
                retryable=True,
            )
        down = "; ".join(f"{m.base_url}: {m.reason}" for m in self.members if not m.usable)
        raise EndpointError(
            f"no formalizer endpoint available ({'; '.join(failed) or 'none tried'}); down: {down or 'none'}",
            status=last.status if last else None,
            retryable=True,
        )

    async def aclose(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            # cancelled: how it ends no longer matters
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._monitor
            self._monitor = None
        for m in self.members:
            await m.client.aclose()

    # -- choice and state -------------------------------------------------------------------------
    def _pick(self, exclude: list[PoolMember]) -> PoolMember | None:
        candidates = [m for m in self.members if m.usable and m not in exclude]
        if not candidates:
            return None
        # Fewest in flight; ties go to the endpoint known up, then to list order.
        return min(candidates, key=lambda m: (m.in_flight, m.state != "up"))

    def _blame(self, answered: list[tuple[PoolMember, str]], request: dict[str, Any]) -> None:
        """Count a request-level 5xx against each endpoint that gave it; mark one down after
        ERRORS_IN_A_ROW distinct requests, unless it is the last usable one (then the others' requests
        would get 503 for an error that may be each request's own)."""
        if not answered or len(self.members) == 1:
            return
        digest = request_digest(request)
        for m, reason in answered:
            if len(m.failed_requests) < ERRORS_IN_A_ROW:  # bounded: enough to decide
                m.failed_requests.add(digest)
            others = [o for o in self.members if o is not m and o.usable]
            if len(m.failed_requests) >= ERRORS_IN_A_ROW and others:
                self._mark_down(m, f"{reason} on {ERRORS_IN_A_ROW} distinct requests in a row")

    def _mark_down(self, member: PoolMember, reason: str) -> None:
        member.failures += 1
        if member.state != "down":
            log.warning("formalizer endpoint %s marked down: %s", member.base_url, reason)
        member.state, member.reason = "down", reason

    async def _recheck_down(self) -> PoolMember | None:
        """Every endpoint is down: check them now (at most once a second each) rather than wait for
        the background check, so a lone server that came back is used at once."""
        now = time.time()
        due = [m for m in self.members if m.checked_at is None or now - m.checked_at >= 1.0]
        if due:
            await asyncio.gather(*(self.check(m) for m in due))
        return self._pick(exclude=[])

    @property
    def healthy(self) -> list[PoolMember]:
        return [m for m in self.members if m.state == "up"]

    # -- health checks ----------------------------------------------------------------------------
    async def check(self, member: PoolMember) -> PoolMember:
        """GET /models: up when it lists every required model, down otherwise (with the reason)."""
        import httpx

        member.checked_at = time.time()
        if self._tls is None:
            self._tls = httpx.create_ssl_context()
        try:
            async with httpx.AsyncClient(
                timeout=self.check_timeout_s, trust_env=False, follow_redirects=False, verify=self._tls
            ) as http:
                r = await http.get(member.base_url + "/models", headers=self._auth_headers())
            r.raise_for_status()
            data = [m for m in r.json()["data"] if isinstance(m, dict)]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            was = member.state
            member.state, member.reason = "down", f"not answering ({type(e).__name__})"
            if was != "down":
                log.warning("formalizer endpoint %s down: %s", member.base_url, member.reason)
            return member
        member.models = [str(m.get("id")) for m in data]
        member.parents = {str(m["id"]): str(m["parent"]) for m in data if m.get("id") and m.get("parent")}
        missing = [w for w in self.required_models if w not in member.models]
        was = member.state
        if missing:
            member.state, member.reason = "down", f"lacks {', '.join(missing)}"
        else:
            member.state, member.reason = "up", None
            if was == "down":
                log.warning("formalizer endpoint %s is back up", member.base_url)
        return member

    async def check_all(self) -> list[PoolMember]:
        self._ensure_monitor()
        await asyncio.gather(*(self.check(m) for m in self.members))
        return self.members

    def _ensure_monitor(self) -> None:
        """Start the background re-check of down endpoints (needs a running loop: started lazily)."""
        loop = asyncio.get_running_loop()
        if self._monitor is None or self._monitor.done() or self._monitor.get_loop() is not loop:
            self._monitor = loop.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            down = [m for m in self.members if m.state == "down"]
            if down:
                await asyncio.gather(*(self.check(m) for m in down), return_exceptions=True)

    def _auth_headers(self) -> dict[str, str]:
        env = self.teacher.api_key_env
        return {"Authorization": f"Bearer {os.environ[env]}"} if env and os.environ.get(env) else {}
