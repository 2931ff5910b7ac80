"""What a route needs, as typed FastAPI dependencies: a router names the part it uses
(`matching: Matching`, `trials: Trials`, ...) instead of reaching into `request.app.state`.

The app (serve/app.py) sets `app.state.services` (serve/services.py), `app.state.reviews`,
`app.state.rereads`, `app.state.cds_hooks` and `app.state.pages` once; the edge
(`auth.Authenticate`) sets the caller's key and session on `request.state`. Nothing here is
documented in the OpenAPI document: each accessor reads only the request itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from .api_keys import KeyEntry, KeyStore
from .audit import AuditStore
from .auth import FailedAttempts
from .cds_hooks.serving import CdsHooksService
from .health.serving import HealthService
from .matching.serving import MatchingService
from .metrics import ServiceMetrics
from .pages.session import Session, SessionStore
from .rereads.serving import RereadService
from .reviews.serving import ReviewService
from .services import Services
from .trials.serving import TrialService


@dataclass(frozen=True)
class PageContext:
    """What the page routes need besides the services: set once by the app as `app.state.pages`."""

    keys: KeyStore
    sessions: SessionStore
    login_attempts: FailedAttempts  # wrong keys pasted at /login, per client address
    secure_cookies: bool = False  # cookies marked Secure even behind a proxy speaking plain HTTP


def services(request: Request) -> Services:
    return request.app.state.services


def matching_service(request: Request) -> MatchingService:
    return services(request).matching


def trial_service(request: Request) -> TrialService:
    return services(request).trials


def health_service(request: Request) -> HealthService:
    return services(request).health


def service_metrics(request: Request) -> ServiceMetrics:
    return services(request).metrics


def audit_store(request: Request) -> AuditStore:
    return services(request).audit


def review_service(request: Request) -> ReviewService:
    return request.app.state.reviews


def cds_hooks_service(request: Request) -> CdsHooksService:
    return request.app.state.cds_hooks


def reread_service(request: Request) -> RereadService:
    return request.app.state.rereads


def page_context(request: Request) -> PageContext:
    return request.app.state.pages


def current_session(request: Request) -> Session | None:
    """The login session the edge (`auth.Authenticate`) found for the cookie; None for a key header."""
    return getattr(request.state, "session", None)


def key_entry(request: Request) -> KeyEntry:
    """The caller's key (header or session), as the edge authenticated it."""
    return request.state.key_entry


AllServices = Annotated[Services, Depends(services)]
Matching = Annotated[MatchingService, Depends(matching_service)]
Trials = Annotated[TrialService, Depends(trial_service)]
Probes = Annotated[HealthService, Depends(health_service)]
Metrics = Annotated[ServiceMetrics, Depends(service_metrics)]
Audit = Annotated[AuditStore, Depends(audit_store)]
Reviews = Annotated[ReviewService, Depends(review_service)]
CdsHooks = Annotated[CdsHooksService, Depends(cds_hooks_service)]
Rereads = Annotated[RereadService, Depends(reread_service)]
Pages = Annotated[PageContext, Depends(page_context)]
CurrentSession = Annotated[Session | None, Depends(current_session)]
Entry = Annotated[KeyEntry, Depends(key_entry)]
