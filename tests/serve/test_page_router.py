"""The HTML routes (serve/pages/router.py) over real HTTP against a real service: login sessions,
CSRF, roles, security headers, the API-key header path kept. The scripted formalizer replays a
reference pair's recorded values. The same flow in a real browser: test_clinician_browser.py."""

from __future__ import annotations

import re

import httpx
import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer
from verdict.serve.api_keys import KeyStore
from verdict.serve.pages.session import LOGIN_COOKIE, SESSION_COOKIE

from tests.serve.conftest import start_service
from tests.serve.page_support import SCRIPTED_MODELS, csrf_of, decide, login, miner_script, reference_pair

MAX_FAILURES = 4


@pytest.fixture(scope="module")
def pair():
    return reference_pair()


@pytest.fixture(scope="module")
def svc(tmp_path_factory, pair):
    srv = ScriptedServer(Script.model_validate(miner_script(pair))).start()
    s = start_service(
        tmp_path_factory.mktemp("pages"),
        srv.url,
        {
            "auth": {"max_failures": MAX_FAILURES, "window_s": 60, "lockout_s": 60},
            "formalizer": SCRIPTED_MODELS,
        },
    )
    store = KeyStore(s.folder / "keys.json")  # the service re-reads the key file
    for role in ("review", "trial_owner"):
        s.keys[role] = store.add(f"test-{role}", [role])[0]
    yield s
    s.stop()
    srv.stop()


@pytest.fixture(scope="module")
def decision(svc, pair):
    return decide(svc, pair)


def assert_page_headers(r: httpx.Response) -> None:
    csp = r.headers["content-security-policy"]
    assert "script-src" not in csp and "'unsafe-inline'" not in csp and "default-src 'none'" in csp
    assert "form-action 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    assert "<script" not in r.text


def set_cookies(r: httpx.Response) -> dict[str, str]:
    return {h.split("=", 1)[0]: h for h in r.headers.get_list("set-cookie")}


def test_login_gives_an_httponly_strict_session_cookie_without_the_key(svc, decision):
    page = decision["links"]["page"]
    c = httpx.Client(base_url=svc.url, trust_env=False)
    form = c.get("/login", params={"next": page})
    assert form.status_code == 200 and 'type="password" name="key"' in form.text
    assert_page_headers(form)
    login_cookie = set_cookies(form)[LOGIN_COOKIE]
    assert "HttpOnly" in login_cookie and "SameSite=Strict" in login_cookie
    token = re.search(r'name="login_token" value="([^"]+)"', form.text).group(1)
    key = svc.keys["review"]
    r = c.post("/login", data={"login_token": token, "key": key, "next": page})
    assert r.status_code == 303 and r.headers["location"] == page
    cookie = set_cookies(r)[SESSION_COOKIE]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    value = c.cookies[SESSION_COOKIE]
    assert key not in cookie and key.split("_")[1] not in value and len(value) >= 40
    got = c.get(page)
    assert got.status_code == 200 and 'data-review="confirm"' in got.text and 'data-review="flag"' in got.text
    assert_page_headers(got)
    assert "Signed in as <strong>test-review</strong>" in got.text
    # the cookie opens the pages only: the JSON API stays key-only
    assert c.get(f"/v1/decisions/{decision['decision_id']}").status_code == 401
    # log out (CSRF-checked): the session is gone on the server
    assert c.post("/logout", data={"csrf": "wrong"}).status_code == 403
    out = c.post("/logout", data={"csrf": csrf_of(got.text)})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    c.cookies.set(SESSION_COOKIE, value)  # replaying the old cookie does not help
    assert c.get(page).status_code == 401


def test_a_login_form_from_elsewhere_and_a_foreign_next_are_refused(svc):
    c = httpx.Client(base_url=svc.url, trust_env=False)
    r = c.post("/login", data={"login_token": "forged", "key": svc.keys["review"], "next": "/login"})
    assert r.status_code == 400 and SESSION_COOKIE not in set_cookies(r)  # login CSRF: no cookie, no match
    evil = login(svc.url, svc.keys["audit"], next_="//evil.example/x")
    assert evil.cookies.get(SESSION_COOKIE)
    form = evil.get("/login", params={"next": "https://evil.example/"})
    assert 'name="next" value="/login"' in form.text


def test_roles_forms_and_csrf(svc, decision):
    page = decision["links"]["page"]
    action = page + "/review"
    # match role: a clear 403 page, no note text
    matcher = login(svc.url, svc.keys["match"], page)
    r = matcher.get(page)
    assert r.status_code == 403 and 'id="error"' in r.text and "audit or review role" in r.text
    assert_page_headers(r)
    # audit role: the page, no forms, and a line saying why; a forged form POST is refused
    auditor = login(svc.url, svc.keys["audit"], page)
    r = auditor.get(page)
    assert r.status_code == 200 and '<form class="review"' not in r.text and 'id="no-forms"' in r.text
    token = csrf_of(r.text)  # the logout form's
    flag = {"type": "flag", "criterion": "x", "note": "n", "reason": "r"}
    r = auditor.post(action, data={"csrf": token, **flag})
    assert r.status_code == 403 and "review role" in r.text
    # review role: a POST without the session's token is refused before anything is read
    reviewer = login(svc.url, svc.keys["review"], page)
    for sent in ({}, {"csrf": "not-the-token"}, {"csrf": token}):  # no token, wrong one, another session's
        r = reviewer.post(action, data={**sent, "type": "flag", "criterion": "x", "note": "n", "reason": "r"})
        assert r.status_code == 403 and "did not come from your session" in r.text, sent
    # the API key header still opens the page (read only: forms need a login session)
    with svc.client("audit") as c:
        r = c.get(page)
    assert r.status_code == 200 and 'id="no-forms"' in r.text and "Log in at /login" in r.text
    assert_page_headers(r)
    with svc.client("audit") as c:
        missing = c.get("/v1/decisions/dec_nope/page")
    assert missing.status_code == 404 and 'id="error"' in missing.text and "dec_nope" in missing.text
    with svc.client("review") as c:
        r = c.post(action, data={"csrf": token, "type": "flag", "criterion": "x", "note": "n", "reason": "r"})
    assert r.status_code == 403


def test_a_form_review_goes_to_the_review_service_and_errors_name_the_field(svc, pair):
    first = decide(svc, pair)
    page = first["links"]["page"]
    reviewer = login(svc.url, svc.keys["review"], page)
    token = csrf_of(reviewer.get(page).text)

    def send(**fields):
        return reviewer.post(page + "/review", data={"csrf": token, **fields})

    atom = next(a for a, v in pair.values.items() if isinstance(v["value"], bool))
    bad = send(type="correct", atom=atom, value="maybe", reason="misread")
    assert bad.status_code == 422 and 'id="problems"' in bad.text and "value" in bad.text
    assert_page_headers(bad)
    empty = send(type="flag", criterion="x", note="n")
    assert empty.status_code == 422 and "reason" in empty.text  # every change needs a reason
    criterion = first["decision"]["labels"][0]["criterion"]
    r = send(type="flag", criterion=criterion, note="the window is 6 months, not 12", reason="protocol p.4")
    assert r.status_code == 303 and r.headers["location"].endswith("/page?reviewed=1")
    new = reviewer.get(r.headers["location"])
    assert new.status_code == 200 and 'id="notice"' in new.text and 'data-change="flag"' in new.text
    assert first["decision_id"] in new.text and "the window is 6 months, not 12" in new.text
    with svc.client("review") as c:
        hist = c.get(r.headers["location"].replace("/page?reviewed=1", "/history"))
    assert [ch["type"] for e in hist.json()["entries"] for ch in e["changes"]] == ["flag"]
    # the old decision is superseded: its page has no forms, and a stale form is refused
    old = reviewer.get(page)
    assert 'id="superseded"' in old.text and '<form class="review"' not in old.text
    again = send(type="flag", criterion=criterion, note="n", reason="r")
    assert again.status_code == 409 and 'id="error"' in again.text


def test_wrong_keys_at_the_login_form_lock_the_address_out(svc):
    c = httpx.Client(base_url=svc.url, trust_env=False)
    codes = []
    for _ in range(MAX_FAILURES + 1):
        token = re.search(r'name="login_token" value="([^"]+)"', c.get("/login").text).group(1)
        codes.append(c.post("/login", data={"login_token": token, "key": "vk_deadbeef_wrong"}).status_code)
    assert codes == [401] * MAX_FAILURES + [429]
    token = re.search(r'name="login_token" value="([^"]+)"', c.get("/login").text).group(1)
    r = c.post("/login", data={"login_token": token, "key": svc.keys["review"]})
    assert r.status_code == 429 and SESSION_COOKIE not in set_cookies(r)  # the right key too, while locked
    assert "vk_deadbeef_wrong" not in svc.log and svc.keys["review"] not in svc.log
