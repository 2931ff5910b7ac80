"""Browser login sessions: a browser cannot send an API key header without script, so a reviewer
pastes the key once at `/login` and gets a session cookie.

The cookie holds only a random token (HttpOnly, SameSite=Strict, Secure over HTTPS); the session
table (in memory, per process) maps the token's hash to the key id and a per-session CSRF token.
Every request re-reads the key's entry from the key file, so a revoked or expired key ends its
sessions at once. Sessions expire after `idle_timeout_s` without a request and `max_age_s` in all.
Each key holds at most `max_sessions_per_key` (its own oldest ends first), so no one key can fill the
table; `max_sessions` over all keys is the backstop (least recently used first).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

from pydantic import BaseModel, ConfigDict, Field, model_validator

SESSION_COOKIE = "verdict_session"
LOGIN_COOKIE = "verdict_login"  # the login form's own token (double submit): no login CSRF
OPEN_PAGE_PATHS = frozenset({"/login"})  # reachable without a key or a session
# Where a session cookie counts: the HTML pages and their forms (each POST checked for its CSRF
# token). The JSON API stays key-only, so no cookie can ever authorize an API call.
SESSION_PATHS = re.compile(r"^/v1/decisions/[^/]+/page(?:/[a-z]+)?$|^/logout$")


class SessionConfig(BaseModel):
    """Browser sessions of the clinician page (`/login`)."""

    model_config = ConfigDict(extra="forbid")

    idle_timeout_s: float = Field(1800.0, gt=0, description="a session without a request for this long ends")
    max_age_s: float = Field(
        8 * 3600.0, gt=0, description="a session ends this long after the login, however active"
    )
    max_sessions: int = Field(
        10_000, ge=2, description="sessions kept at once, all keys; past it the least recently used one ends"
    )
    max_sessions_per_key: int = Field(
        20,
        ge=1,
        description="sessions one key holds at once; past it that key's least recently used one ends",
    )

    @model_validator(mode="after")
    def _one_key_cannot_fill_the_table(self):
        if self.max_sessions_per_key >= self.max_sessions:
            raise ValueError(
                f"max_sessions_per_key ({self.max_sessions_per_key}) must be below max_sessions "
                f"({self.max_sessions}): one key must not be able to end every other session"
            )
        return self


@dataclass
class Session:
    key_id: str
    csrf: str  # the token every form POST of this session must carry
    created: float
    last_seen: float


class SessionStore:
    def __init__(self, config: SessionConfig | None = None, clock=time.time):
        self.config = config or SessionConfig()
        self.clock = clock
        self._lock = threading.Lock()
        self._by_hash: dict[str, Session] = {}

    # -- the table ---------------------------------------------------------------------------------
    def create(self, key_id: str) -> tuple[str, Session]:
        """A new session for the key id: (the cookie's token, the session)."""
        token, now = secrets.token_urlsafe(32), self.clock()
        session = Session(key_id=key_id, csrf=secrets.token_urlsafe(32), created=now, last_seen=now)
        with self._lock:
            self._expire(now)
            own = [h for h, s in self._by_hash.items() if s.key_id == key_id]
            if len(own) >= self.config.max_sessions_per_key:  # this key's own oldest ends first
                self._end_least_recent(own)
            elif len(self._by_hash) >= self.config.max_sessions:  # the backstop over all keys
                self._end_least_recent(self._by_hash)
            self._by_hash[_hash(token)] = session
        return token, session

    def get(self, token: str | None) -> Session | None:
        """The live session of a cookie token (its idle time restarts), or None."""
        if not token:
            return None
        now = self.clock()
        with self._lock:
            h = _hash(token)
            s = self._by_hash.get(h)
            if s is None:
                return None
            if self._ended(s, now):
                del self._by_hash[h]
                return None
            s.last_seen = now
            return s

    def end(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._by_hash.pop(_hash(token), None)

    def count(self) -> int:
        with self._lock:
            self._expire(self.clock())
            return len(self._by_hash)

    def _end_least_recent(self, hashes) -> None:
        del self._by_hash[min(hashes, key=lambda h: self._by_hash[h].last_seen)]

    def _ended(self, s: Session, now: float) -> bool:
        c = self.config
        return now - s.last_seen >= c.idle_timeout_s or now - s.created >= c.max_age_s

    def _expire(self, now: float) -> None:
        for h in [h for h, s in self._by_hash.items() if self._ended(s, now)]:
            del self._by_hash[h]

    # -- requests ----------------------------------------------------------------------------------
    def from_scope(self, scope) -> tuple[str, Session] | None:
        """The request's session cookie and its live session, or None."""
        token = cookie_value(scope, SESSION_COOKIE)
        s = self.get(token)
        return (token, s) if s is not None and token else None

    def authenticate(self, scope, keys):
        """The key entry behind the request's session (the key file re-read: a revoked or expired key
        ends the session), or None. Sets `scope["state"]["session"]`."""
        if not SESSION_PATHS.match(scope.get("path") or ""):
            return None
        found = self.from_scope(scope)
        if found is None:
            return None
        token, session = found
        entry = keys.entry(session.key_id)
        if entry is None:
            self.end(token)
            return None
        scope.setdefault("state", {})["session"] = session
        return entry


def csrf_ok(session: Session | None, sent: str | None) -> bool:
    return session is not None and bool(sent) and hmac.compare_digest(session.csrf, sent or "")


def cookie_value(scope, name: str) -> str | None:
    raw = b"; ".join(v for k, v in scope.get("headers") or [] if k == b"cookie")
    if not raw:
        return None
    try:
        jar = SimpleCookie(raw.decode("latin-1"))
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


def set_cookie_header(name: str, value: str, path: str, max_age: int | None, secure: bool) -> str:
    """A Set-Cookie value: HttpOnly (no script reads it), SameSite=Strict (never sent by a request
    another site starts), Secure over HTTPS."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
