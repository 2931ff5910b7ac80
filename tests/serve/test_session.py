"""Browser login sessions (serve/pages/session.py): expiry, revocation, where a cookie counts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from verdict.serve.api_keys import KeyStore
from verdict.serve.pages.session import (
    SESSION_COOKIE,
    SessionConfig,
    SessionStore,
    cookie_value,
    csrf_ok,
    set_cookie_header,
)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def scope(path: str, token: str | None) -> dict:
    headers = [(b"cookie", f"other=1; {SESSION_COOKIE}={token}".encode())] if token else []
    return {"type": "http", "path": path, "headers": headers}


def test_sessions_end_after_the_idle_time_and_the_maximum_age():
    clock = Clock()
    store = SessionStore(SessionConfig(idle_timeout_s=60, max_age_s=150), clock=clock)
    token, s = store.create("abcd1234")
    assert store.get(token) is s and store.get("not-a-token") is None and store.get(None) is None
    clock.t += 59
    assert store.get(token) is s  # each request restarts the idle time
    clock.t += 59
    assert store.get(token) is s
    clock.t += 40  # 158 s after the login: past max_age however active
    assert store.get(token) is None and store.count() == 0
    token2, _ = store.create("abcd1234")
    clock.t += 61
    assert store.get(token2) is None


def test_the_table_keeps_no_token_and_is_bounded():
    store = SessionStore(SessionConfig(max_sessions=2, max_sessions_per_key=1), clock=Clock())
    tokens = [store.create(f"key{i:05d}")[0] for i in range(3)]
    assert store.count() == 2 and store.get(tokens[0]) is None and store.get(tokens[2]) is not None
    assert not any(t in repr(store._by_hash) for t in tokens)  # hashed: a dump of the table logs in no one


def test_one_key_logging_in_again_and_again_ends_only_its_own_sessions():
    """Issue 22.8: 10,050 logins with one audit key used to end a reviewer's session (LRU over all)."""
    clock = Clock()
    store = SessionStore(SessionConfig(max_sessions=10_000, max_sessions_per_key=20), clock=clock)
    reviewer, _ = store.create("reviewer")
    first = []
    for i in range(10_050):
        clock.t += 0.001
        token, _ = store.create("attacker")
        first += [token] if i < 3 else []
    assert store.get(reviewer) is not None and store.count() == 21
    assert all(store.get(t) is None for t in first)  # the attacker's own oldest sessions ended
    # the global cap stays a backstop: many keys past it end the least recently used session
    small = SessionStore(SessionConfig(max_sessions=3, max_sessions_per_key=2), clock=clock)
    tokens = [small.create(f"key{i}")[0] for i in range(4)]
    assert small.count() == 3 and small.get(tokens[0]) is None and small.get(tokens[3]) is not None


def test_a_per_key_cap_that_lets_one_key_fill_the_table_is_refused():
    with pytest.raises(ValidationError, match="max_sessions_per_key"):
        SessionConfig(max_sessions=20, max_sessions_per_key=20)


def test_a_revoked_key_ends_its_sessions_and_a_cookie_counts_on_pages_only(tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    _, entry = keys.add("dr", ["review"])
    store = SessionStore()
    token, session = store.create(entry.id)
    page = scope("/v1/decisions/dec_1/page", token)
    assert store.authenticate(page, keys).id == entry.id and page["state"]["session"] is session
    assert store.authenticate(scope("/v1/decisions/dec_1/page/review", token), keys) is not None
    assert store.authenticate(scope("/logout", token), keys) is not None
    # the JSON API stays key-only: a cookie never authorizes it
    for path in ("/v1/decisions/dec_1", "/v1/match", "/v1/decisions/dec_1/reviews", "/metrics"):
        assert store.authenticate(scope(path, token), keys) is None, path
    keys.revoke(entry.id)
    assert store.authenticate(page, keys) is None and store.get(token) is None


def test_cookie_parsing_and_attributes():
    assert cookie_value(scope("/", "tok-1"), SESSION_COOKIE) == "tok-1"
    assert cookie_value({"headers": [(b"cookie", b"\x00bad;;==")]}, SESSION_COOKIE) is None
    assert cookie_value({"headers": []}, SESSION_COOKIE) is None
    header = set_cookie_header(SESSION_COOKIE, "tok", "/", None, secure=True)
    assert header == f"{SESSION_COOKIE}=tok; Path=/; HttpOnly; SameSite=Strict; Secure"
    assert "Max-Age=0" in set_cookie_header(SESSION_COOKIE, "", "/", 0, secure=False)
    store = SessionStore()
    _, s = store.create("abcd1234")
    assert csrf_ok(s, s.csrf) and not csrf_ok(s, "") and not csrf_ok(s, s.csrf[:-1] + "x")
    assert not csrf_ok(None, s.csrf)
