"""The HTML routes: login, logout, the clinician page of a decision and its review forms.

    GET  /login                               the login form (paste an API key)
    POST /login                               key checked -> session cookie -> back to `next`
    POST /logout                              ends the session (CSRF-checked)
    GET  /v1/decisions/{id}/page              the clinician page (audit or review role)
    POST /v1/decisions/{id}/page/review       one review form (review role, session + CSRF token)

A page is reached with an API key header (as before) or a login session (`session.py`; the edge,
`auth.Authenticate`, turns the cookie into the key's entry). The forms work without script; each
POST carries the session's CSRF token in a hidden field. A review goes to the review service
(serve/reviews), which re-derives the decision; this module only turns a form
into a `ReviewRequest` and the answer into a redirect to the new decision's page. Every error is an
HTML page naming the field, never a traceback. The routes are module-level; what they need (the key
store, the sessions, the review service, the caller's key and session) comes through the typed
dependencies of serve/dependencies.py.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError
from verdict.core.errors import VerdictError, describe_validation_error

from ..audit.serving import decision_row
from ..clinician_page import PAGE_CSP, PageViewer, render_page, render_template
from ..dependencies import AllServices, CurrentSession, Entry, Metrics, PageContext, Pages, Reviews
from ..errors import ServiceError
from ..reviews.protocol import ReviewRequest
from ..roles import bearer
from .session import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    cookie_value,
    csrf_ok,
    set_cookie_header,
)

log = logging.getLogger("verdict.serve.pages")
PAGE_HEADERS = {"Cache-Control": "no-store", "Content-Security-Policy": PAGE_CSP}
LOGIN_FORM_MAX_AGE = 600  # seconds a login form stays usable
# The form fields each change type takes (everything else a form sends is ignored).
CHANGE_FIELDS = {
    "confirm": ("atom", "value", "established", "evidence", "reason"),
    "correct": ("atom", "value", "evidence", "reason"),
    "flag": ("criterion", "note", "reason"),
}
PAGE_ROLES = ("audit", "review")


def page_viewer(
    entry: Entry,
    session: CurrentSession,
) -> PageViewer:
    return PageViewer(
        csrf=session.csrf if session is not None else None,
        can_review=entry.allows("review"),
        who=entry.name,
        logout=session is not None,
    )


Viewer = Annotated[PageViewer, Depends(page_viewer)]
router = APIRouter()


def html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={**PAGE_HEADERS, **(headers or {})})


def error_page(
    status: int,
    title: str,
    message: str,
    problems: list[str] | None = None,
    back: str | None = None,
    viewer: PageViewer | None = None,
) -> HTMLResponse:
    page = render_template(
        "error.html", title, viewer, status=status, message=message, problems=problems or [], back=back
    )
    return html(page, status)


def safe_next(target: str | None) -> str:
    """Only a path on this service (never another site: no scheme, no `//host`)."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/login"


def secure(request: Request, pages: PageContext) -> bool:
    return pages.secure_cookies or request.url.scheme == "https"


def login_form(
    request: Request, pages: PageContext, message: str = "", status: int = 200, next_: str = "/login"
) -> Response:
    token = secrets.token_urlsafe(24)
    signed_in = pages.sessions.from_scope(request.scope)
    entry = pages.keys.entry(signed_in[1].key_id) if signed_in is not None else None
    body = render_template(
        "login.html",
        "Sign in",
        signed_in=entry.name if entry is not None else None,
        message=message,
        token=token,
        next=safe_next(next_),
    )
    cookie = set_cookie_header(LOGIN_COOKIE, token, "/login", LOGIN_FORM_MAX_AGE, secure(request, pages))
    return html(body, status, {"Set-Cookie": cookie})


@router.get("/login", include_in_schema=False)
async def get_login(request: Request, pages: Pages, next: str = "/login") -> Response:
    return login_form(request, pages, next_=next)


@router.post("/login", include_in_schema=False)
async def post_login(request: Request, pages: Pages) -> Response:
    form = await request.form()
    next_ = safe_next(str(form.get("next") or ""))
    sent, expected = str(form.get("login_token") or ""), cookie_value(request.scope, LOGIN_COOKIE)
    if not expected or not secrets.compare_digest(sent, expected):  # login CSRF: not our form
        return login_form(request, pages, "The sign-in form expired: please try again.", 400, next_)
    client = request.client.host if request.client else "-"
    subject = f"login:{client}"
    left = pages.login_attempts.locked(subject)
    if left > 0:
        return login_form(request, pages, f"Too many wrong keys: try again in {left:.0f} s.", 429, next_)
    entry = pages.keys.authenticate(str(form.get("key") or "").strip())
    if entry is None:
        locked = pages.login_attempts.fail(subject)
        log.warning("failed login client=%s%s", client, " -> locked out" if locked else "")
        return login_form(request, pages, "That key is not valid (wrong, revoked or expired).", 401, next_)
    pages.sessions.end(cookie_value(request.scope, SESSION_COOKIE))  # a new session on every login
    token, _ = pages.sessions.create(entry.id)
    log.info("login key=%s", entry.id)
    resp = RedirectResponse(next_, status_code=303, headers=PAGE_HEADERS)
    https = secure(request, pages)
    resp.headers.append("Set-Cookie", set_cookie_header(SESSION_COOKIE, token, "/", None, https))
    resp.headers.append("Set-Cookie", set_cookie_header(LOGIN_COOKIE, "", "/login", 0, https))
    return resp


@router.post("/logout", include_in_schema=False)
async def post_logout(request: Request, pages: Pages, session: CurrentSession) -> Response:
    form = await request.form()
    if not csrf_ok(session, str(form.get("csrf") or "")):
        return error_page(403, "Not signed out", "This form did not come from your session's page.")
    pages.sessions.end(cookie_value(request.scope, SESSION_COOKIE))
    resp = RedirectResponse("/login", status_code=303, headers=PAGE_HEADERS)
    resp.headers.append("Set-Cookie", set_cookie_header(SESSION_COOKIE, "", "/", 0, secure(request, pages)))
    return resp


@router.get(
    "/v1/decisions/{decision_id}/page",
    response_class=HTMLResponse,
    tags=["audit"],
    responses={
        401: {"description": "missing or invalid API key (JSON error body)"},
        403: {"description": "the key lacks the audit or review role (HTML page)"},
        404: {"description": "unknown decision (HTML page)"},
    },
)
async def decision_page(
    decision_id: str,
    request: Request,
    _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],  # documents the key
    entry: Entry,
    viewer: Viewer,
    services: AllServices,
    reviews: Reviews,
    reviewed: bool = False,
) -> Response:
    """The clinician's page of a decision: the deciding criteria first, evidence highlighted in the
    note, what to confirm at the visit, what would change the decision, the history, and review
    forms for a signed-in reviewer (audit or review role; an API key header or a `/login` session)."""
    if not any(entry.allows(r) for r in PAGE_ROLES):
        return error_page(403, "Not allowed", "Reading a decision's page needs the audit or review role.")
    notice = "Your review is recorded: this is the re-derived decision." if reviewed else ""

    def page() -> str:  # store reads and rendering: in a worker thread, never on the event loop
        row = decision_row(services.audit, decision_id)
        program = services.trials.program_version(row.trial_id, row.program_hash)
        history = reviews.history(decision_id, latest=True)
        return render_page(row, program, viewer, history=history, notice=notice)

    try:
        return html(await asyncio.to_thread(page))
    except ServiceError as e:
        services.metrics.errors.labels(e.code).inc()
        return error_page(e.status, "Decision not shown", e.summary, e.problems, viewer=viewer)


@router.post("/v1/decisions/{decision_id}/page/review", include_in_schema=False)
async def review_form(
    decision_id: str,
    request: Request,
    entry: Entry,
    viewer: Viewer,
    session: CurrentSession,
    reviews: Reviews,
    metrics: Metrics,
) -> Response:
    page = f"/v1/decisions/{quote(decision_id, safe='')}/page"
    form = await request.form()
    if not csrf_ok(session, str(form.get("csrf") or "")):
        # an API key header has no CSRF token: the forms are for signed-in browsers only
        return error_page(
            403,
            "Review not recorded",
            "This form did not come from your session's page (sign in at /login and use the page's forms).",
            back=page,
            viewer=viewer,
        )
    if not entry.allows("review"):
        return error_page(
            403, "Review not recorded", "Reviewing needs the review role.", back=page, viewer=viewer
        )
    kind = str(form.get("type") or "")
    if kind not in CHANGE_FIELDS:
        return error_page(
            422,
            "Review not recorded",
            "invalid review form",
            [f"type: one of {', '.join(CHANGE_FIELDS)}"],
            back=page,
            viewer=viewer,
        )
    change: dict = {"type": kind}
    for name in CHANGE_FIELDS[kind]:
        v = form.get(name)
        if isinstance(v, str) and (v.strip() or name not in ("evidence",)):
            change[name] = v.strip()
    if kind == "correct" and change.get("value", "").lower() == "unknown":
        change["value"] = None  # unknown: left to the policy
    try:
        req = ReviewRequest.model_validate({"changes": [change]})
    except ValidationError as e:
        problems = [
            p.removeprefix("changes.0.").removeprefix(f"{kind}.")
            for p in describe_validation_error(e, "form")
        ]
        return error_page(
            422, "Review not recorded", "invalid review form", problems, back=page, viewer=viewer
        )
    try:
        answer = await reviews.review(decision_id, req, entry)
    except ServiceError as e:
        metrics.errors.labels(e.code).inc()
        return error_page(e.status, "Review not recorded", e.summary, e.problems, back=page, viewer=viewer)
    except VerdictError as e:  # a change the core refuses (a value outside the atom's domain)
        return error_page(422, "Review not recorded", e.summary, e.problems, back=page, viewer=viewer)
    target = f"/v1/decisions/{quote(answer.decision_id, safe='')}/page?reviewed=1"
    return RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)
