"""Authentication at the HTTP edge, before the app reads a byte of the body.

`Authenticate` (ASGI) checks the API key of every request but the health checks: a missing or wrong
key is a 401 whatever the body, and the body of an unauthenticated request is never parsed. Wrong
keys (not a missing one) are counted per client address (`FailedAttempts`): past the limit, that
address gets 429 + Retry-After for the lockout time, the right key included. Never per attempted key
id: key ids are shown on pages, flags, history and audit records, so a count per claimed id would let
anyone lock a key's owner out; and a key's 256-bit secret cannot be guessed, so nothing is lost. Each
failure is logged with the client address and the attempted key id, never the secret.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from .api_config import AuthLimits
from .api_keys import PREFIX, KeyStore
from .errors import ServiceError
from .middleware import send_json
from .pages.session import OPEN_PAGE_PATHS

log = logging.getLogger("verdict.serve.auth")
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # no key needed (load balancers, orchestrators)


class FailedAttempts:
    """Failed key attempts in a sliding window, and the lockouts they cause."""

    def __init__(self, limits: AuthLimits, clock=time.monotonic):
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}
        self._locked_until: dict[str, float] = {}

    def locked(self, *subjects: str) -> float:
        """Seconds left of the longest lockout among the subjects (0: none)."""
        now = self.clock()
        with self._lock:
            left = [self._locked_until.get(s, 0.0) - now for s in subjects]
        return max([0.0, *left])

    def fail(self, *subjects: str) -> bool:
        """Count a failure for each subject; True if one of them is now locked out."""
        now, lim = self.clock(), self.limits
        locked = False
        with self._lock:
            for s in subjects:
                q = self._failures.setdefault(s, deque())
                q.append(now)
                while q and q[0] <= now - lim.window_s:
                    q.popleft()
                if len(q) >= lim.max_failures:
                    self._locked_until[s] = now + lim.lockout_s
                    q.clear()
                    locked = True
            if len(self._failures) > 100_000:  # bounded memory under a spray of addresses
                self._failures = {k: v for k, v in self._failures.items() if v and v[-1] > now - lim.window_s}
                self._locked_until = {k: t for k, t in self._locked_until.items() if t > now}
        return locked


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    """`Authorization: Bearer ...` or `X-API-Key`."""
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None


def key_id_of(key: str | None) -> str:
    """The id part of `vk_<id>_<secret>` (what a log may name), or '-'."""
    if not key or not key.startswith(PREFIX):
        return "-"
    kid = key[len(PREFIX) :].split("_", 1)[0]
    return kid if len(kid) == 8 and kid.isalnum() else "(malformed)"


class Authenticate:
    def __init__(
        self,
        app,
        keys: KeyStore,
        limits: AuthLimits,
        metrics=None,
        sessions=None,
        own_auth: tuple[str, ...] = (),
    ):
        self.app = app
        self.own_auth = own_auth  # path prefixes whose routes authenticate their callers otherwise
        self.keys = keys
        self.attempts = FailedAttempts(limits)
        self.metrics = metrics
        self.sessions = sessions  # serve.pages.session.SessionStore: a browser's login cookie
        self.open_paths = OPEN_PATHS | (OPEN_PAGE_PATHS if sessions is not None else frozenset())

    async def __call__(self, scope, receive, send):
        path = scope.get("path") or ""
        if scope["type"] != "http" or path in self.open_paths or self._own(path):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        key = presented_key(headers)
        if key is None and self.sessions is not None:  # no key header: a browser's login session?
            entry = self.sessions.authenticate(scope, self.keys)
            if entry is not None:
                state = scope.setdefault("state", {})
                state["key_entry"], state["key_id"] = entry, entry.id
                return await self.app(scope, receive, send)
        client = (scope.get("client") or ("-", 0))[0]
        kid = key_id_of(key)
        subjects = [f"addr:{client}"]  # by client only: a stranger can claim any key id (see above)
        left = self.attempts.locked(*subjects)
        if left > 0:  # the lockout's start is logged; the access log has each refusal
            return await self._refuse(
                send,
                429,
                "too_many_failed_keys",
                f"too many failed API keys; try again in {left:.0f} s",
                [(b"retry-after", str(int(left) + 1).encode())],
            )
        try:
            entry = self.keys.authenticate(key)
        except ServiceError as e:  # the key file is unreadable and no good copy was loaded
            log.error("authentication unavailable: %s", e.summary)
            return await self._refuse(send, e.status, e.code, e.summary, [])
        if entry is None and key is None:  # no key at all: refused, but not a guess to count
            return await self._refuse(
                send, 401, "unauthorized", "missing or invalid API key", [(b"www-authenticate", b"Bearer")]
            )
        if entry is None:
            locked = self.attempts.fail(*subjects)
            log.warning(
                "failed API key client=%s key_id=%s%s", client, kid, " -> locked out" if locked else ""
            )
            return await self._refuse(
                send, 401, "unauthorized", "missing or invalid API key", [(b"www-authenticate", b"Bearer")]
            )
        state = scope.setdefault("state", {})
        state["key_entry"], state["key_id"] = entry, entry.id
        return await self.app(scope, receive, send)

    def _own(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self.own_auth)

    async def _refuse(self, send, status: int, code: str, message: str, headers) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(code).inc()
        await send_json(send, status, {"error": code, "message": message, "problems": []}, headers)
