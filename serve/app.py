"""The matching API: the service, keys and state, the routers, and the middleware. Routes are one
router per endpoint group (health/, trials/, matching/, audit/, screen/, reviews/, rereads/,
pages/, cds_hooks/: `router.py`, naming what it needs through serve/dependencies.py); models are
`protocol.py`, logic `serving.py`, the parts they share are built once by serve/services.py; the
one error shape is `error_mapping.install_error_handlers`.

    app = create_app(api_config, base_url="http://127.0.0.1:8011/v1")

`create_app` refuses (ServeConfigError) when the formalizer is not on the site's allowlist, so a
misconfigured service never starts. Every route except /healthz, /readyz and /cds-services needs an
API key (`Authorization: Bearer vk_...` or `X-API-Key`) with the route's role; the key and the
route's role are checked at the edge (`auth.Authenticate`, `roles.RoleFirst`), before the body is
read. /cds-services takes an EHR's signed JWT instead (serve/cds_hooks), also checked at the edge.
`/openapi.json` exists only with `api.docs`, behind a key; there are no Swagger UI or ReDoc pages
(they load scripts from a public CDN).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from .api_config import ApiConfig
from .api_keys import KeyStore
from .audit.router import router as audit_router
from .auth import Authenticate, FailedAttempts
from .cds_hooks.router import PREFIX as CDS_HOOKS
from .cds_hooks.router import JwtFirst
from .cds_hooks.router import router as cds_hooks_router
from .cds_hooks.serving import CdsHooksService
from .contract import with_stream_lines
from .dependencies import PageContext
from .error_mapping import install_error_handlers
from .health.router import router as health_router
from .matching.router import router as matching_router
from .metrics import ServiceMetrics
from .middleware import AccessLog, BodyLimit, SecurityHeaders
from .pages.router import router as pages_router
from .pages.session import SessionStore
from .rereads.router import router as rereads_router
from .rereads.serving import RereadService
from .reviews.router import router as reviews_router
from .reviews.serving import ReviewService
from .roles import Forbidden, RoleFirst, Unauthorized  # noqa: F401 - importable from here as before
from .screen.router import router as screen_router
from .services import Services
from .trials.router import router as trials_router


def create_app(config: ApiConfig, base_url: str, *, services: Services | None = None) -> FastAPI:
    metrics = ServiceMetrics()
    services = services or Services(config, base_url, metrics=metrics)
    metrics = services.metrics
    metrics.watch_formalizers(services.formalizers.pool.members)  # verdict_formalizer_up{endpoint}
    keys = KeyStore(config.api_keys)
    keys.load()  # a broken key file stops the start, not the first request
    keys.count()  # the good copy kept if the file breaks at run time

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        services.warm_up()
        yield
        await app.state.cds_hooks.aclose()
        await services.aclose()
        services.audit.close()

    app = FastAPI(
        title="Verdict matching service",
        version="1",
        description="Accountable clinical-trial eligibility matching: student formalizers (vLLM) + the Z3 "
        "core.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if config.docs else None,
        # one schema per model (a program is the same object in a request and a response), so that
        # components keep their model names (no TrialProgram-Input / -Output pairs)
        separate_input_output_schemas=False,
    )
    app.openapi = lambda: with_stream_lines(FastAPI.openapi(app))  # (serve/contract.py)
    # What the routes reach through serve/dependencies.py:
    app.state.services = services
    app.state.reviews = ReviewService(services)  # reviews, history, revisions, flags (serve/reviews)
    app.state.cds_hooks = CdsHooksService(services, app.state.reviews)  # matches in the EHR (serve/cds_hooks)
    app.state.rereads = RereadService(app.state.reviews)  # the chart read again (serve/rereads)

    install_error_handlers(app, metrics)  # one error shape everywhere (serve/error_mapping.py)

    # Each endpoint group's routes; each names what it needs (serve/dependencies.py).
    sessions = SessionStore(config.sessions)
    app.state.sessions = sessions
    login_attempts = FailedAttempts(config.auth)  # wrong keys pasted at /login, per client address
    app.state.pages = PageContext(keys, sessions, login_attempts, secure_cookies=config.tls.enabled)
    routers = (
        health_router,  # /healthz, /readyz, /metrics (serve/health)
        trials_router,  # /v1/trials (serve/trials)
        matching_router,  # /v1/match, /v1/match/batch (serve/matching)
        audit_router,  # GET /v1/decisions/{id} (serve/audit)
        screen_router,  # POST /v1/screen (serve/screen)
        reviews_router,  # reviews, history, revisions, flags (serve/reviews)
        rereads_router,  # atoms read again in the whole chart, staged mining completed (serve/rereads)
        # the HTML pages: login, the clinician page and its review forms (serve/pages)
        pages_router,
        cds_hooks_router,  # /cds-services: CDS Hooks 2.0, an EHR's signed JWT (serve/cds_hooks)
    )
    for router in routers:
        app.include_router(router)

    # Outermost last: headers (on every answer, the last guard's 500 included) -> log -> key ->
    # the route's role (before its body or query is read) -> body limit -> an EHR's JWT -> routes.
    app.add_middleware(JwtFirst, metrics=metrics)
    app.add_middleware(BodyLimit, max_bytes=config.limits.max_body_bytes)
    app.add_middleware(RoleFirst, routes=[r for router in routers for r in router.routes], metrics=metrics)
    app.add_middleware(
        Authenticate, keys=keys, limits=config.auth, metrics=metrics, sessions=sessions, own_auth=(CDS_HOOKS,)
    )
    app.add_middleware(AccessLog, metrics=metrics)
    app.add_middleware(SecurityHeaders)
    return app
