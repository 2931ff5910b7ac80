"""The matching API: routes, authentication and error shapes. The logic is in `serving.py`.

    app = create_app(api_config, base_url="http://127.0.0.1:8011/v1")

`create_app` refuses (ServeConfigError) when the formalizer is not on the site's allowlist, so a
misconfigured service never starts. Every route except /healthz and /readyz needs an API key
(`Authorization: Bearer vk_...` or `X-API-Key`) with the route's role; the key is checked at the
edge (`auth.Authenticate`), before the body is read. `/openapi.json` exists only with `api.docs`,
behind a key; there are no Swagger UI or ReDoc pages (they load scripts from a public CDN).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .api_config import ApiConfig
from .api_keys import KeyEntry, KeyStore
from .auth import Authenticate, FailedAttempts
from .errors import ServiceError
from .metrics import ServiceMetrics
from .middleware import AccessLog, BodyLimit, SecurityHeaders
from .pages.router import page_routes
from .screen.router import router as screen_router
from .pages.session import SessionStore
from .protocol import (
    BatchLine,
    BatchRequest,
    DecisionRecord,
    ErrorBody,
    Health,
    MatchRequest,
    MatchResponse,
    Problem,
    Readiness,
    TrialRequest,
    TrialResponse,
)
from .reviews.router import router as reviews_router
from .roles import Forbidden, Unauthorized, require  # noqa: F401 - Unauthorized: importable from here as before
from .reviews.serving import ReviewService
from .serving import MatchingService, error_body

_ERROR_TEXT = {
    401: "missing or invalid API key",
    403: "the key lacks the role",
    404: "not found",
    413: "request body too large",
    422: "invalid request: every invalid field is named",
}
_ERRORS = {code: {"model": ErrorBody, "description": text} for code, text in _ERROR_TEXT.items()}
_FORMALIZER_ERRORS = {
    **_ERRORS,
    502: {"model": ErrorBody, "description": "formalizer output invalid after one repair"},
    503: {"model": ErrorBody, "description": "formalizer down or slow; see Retry-After"},
}




def create_app(config: ApiConfig, base_url: str, *, service: MatchingService | None = None) -> FastAPI:
    metrics = ServiceMetrics()
    service = service or MatchingService(config, base_url, metrics=metrics)
    metrics = service.metrics
    keys = KeyStore(config.api_keys)
    keys.load()  # a broken key file stops the start, not the first request
    keys.count()  # the good copy kept if the file breaks at run time

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        service.warm_up()
        yield
        await service.aclose()
        service.audit.close()

    app = FastAPI(
        title="Verdict matching service",
        version="1",
        description="Accountable clinical-trial eligibility matching: student formalizers (vLLM) + the Z3 "
        "core.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if config.docs else None,
    )
    app.state.service = service
    app.state.reviews = ReviewService(service)  # reviews, history, revisions, flags (serve/reviews)

    matcher = Depends(require("match"))
    reader = Depends(require("match", "audit"))
    auditor = Depends(require("audit"))

    # -- errors: one shape everywhere, naming fields, never echoing input ------------------------
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, e: ServiceError):
        metrics.errors.labels(e.code).inc()
        return JSONResponse(error_body(e).model_dump(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, e: RequestValidationError):
        metrics.errors.labels("invalid_request").inc()
        problems = []
        for err in e.errors():
            loc = list(err.get("loc", ()))
            if loc and loc[0] == "body":
                loc = loc[1:]
            problems.append(
                Problem(field=".".join(str(p) for p in loc) or "body", message=err.get("msg", "invalid"))
            )
        body = ErrorBody(
            error="invalid_request",
            message="invalid request: " + ", ".join(sorted({p.field for p in problems})),
            problems=problems,
        )
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, e: StarletteHTTPException):
        if e.status_code == 400:  # a body that is not even text (FastAPI's "error parsing the body")
            metrics.errors.labels("invalid_request").inc()
            return JSONResponse(
                ErrorBody(
                    error="invalid_request",
                    message="invalid request: body",
                    problems=[Problem(field="body", message="not valid UTF-8 JSON")],
                ).model_dump(),
                status_code=422,
            )
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return JSONResponse(
            ErrorBody(error=code, message=str(e.detail)).model_dump(),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    # -- health ----------------------------------------------------------------------------------
    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        """The process is up (no key needed)."""
        return Health()

    @app.get("/readyz", response_model=Readiness, tags=["health"], responses={503: {"model": Readiness}})
    async def readyz():
        """The formalizer server answers and serves both adapters (no key needed)."""
        r = await service.readiness()
        return JSONResponse(r.model_dump(), status_code=200 if r.ready else 503)

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={**_ERRORS, 200: {"description": "Prometheus text format", "content": {"text/plain": {}}}},
    )
    async def metrics_endpoint(_key: KeyEntry = auditor):
        """Prometheus metrics (audit role)."""
        return Response(metrics.exposition(), media_type=metrics.content_type)

    # -- trials ----------------------------------------------------------------------------------
    @app.post("/v1/trials", response_model=TrialResponse, tags=["trials"], responses=_FORMALIZER_ERRORS)
    async def post_trial(req: TrialRequest, key: KeyEntry = matcher) -> TrialResponse:
        """Criteria text or a ClinicalTrials.gov study -> the parser student -> a checked trial program,
        cached by content (parsed once). Or upload a reviewed program (admin role), which supersedes
        the parser's for its trial id."""
        if req.program is not None and not key.allows("admin"):
            raise Forbidden("uploading a reviewed program needs the admin role")
        return await service.register_trial(req, key.id)

    @app.get("/v1/trials/{trial_id}", response_model=TrialResponse, tags=["trials"], responses=_ERRORS)
    async def get_trial(
        trial_id: str, program_hash: str | None = None, _key: KeyEntry = reader
    ) -> TrialResponse:
        """The newest program of a trial, or the version `program_hash`."""
        return service.get_trial(trial_id, program_hash)

    # -- matching --------------------------------------------------------------------------------
    @app.post("/v1/match", response_model=MatchResponse, tags=["matching"], responses=_FORMALIZER_ERRORS)
    async def match(req: MatchRequest, key: KeyEntry = matcher) -> MatchResponse:
        """A trial and a patient note -> value miner (inclusion and exclusion passes) -> policy -> core:
        the full Decision, the resolved patient with evidence, and the rationale. Recorded for audit."""
        return await service.match(req, key.id)

    @app.post(
        "/v1/match/batch",
        tags=["matching"],
        response_class=StreamingResponse,
        responses={
            **_ERRORS,
            200: {
                "description": "NDJSON stream of BatchLine objects, in completion order",
                "content": {"application/x-ndjson": {"schema": BatchLine.model_json_schema()}},
            },
        },
    )
    async def match_batch(req: BatchRequest, key: KeyEntry = matcher):
        """Every patient against every trial; one JSON line per pair as it finishes."""
        lines = service.match_batch(req, key.id)
        first = await anext(lines, None)  # validation errors surface as a status, before streaming

        async def stream():
            if first is not None:
                yield first.model_dump_json(by_alias=True) + "\n"
                async for line in lines:
                    yield line.model_dump_json(by_alias=True) + "\n"

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    # -- audit -----------------------------------------------------------------------------------
    @app.get("/v1/decisions/{decision_id}", response_model=DecisionRecord, tags=["audit"], responses=_ERRORS)
    async def get_decision(decision_id: str, _key: KeyEntry = auditor) -> DecisionRecord:
        """A decision from the append-only audit store (audit role)."""
        return service.decision_record(decision_id)

    app.include_router(screen_router)  # POST /v1/screen (serve/screen)
    app.include_router(reviews_router)  # reviews, history, revisions, flags (serve/reviews)

    # -- the HTML pages: login, the clinician page and its review forms (serve/pages) -------------
    sessions = SessionStore(config.sessions)
    app.state.sessions = sessions
    login_attempts = FailedAttempts(config.auth)  # wrong keys pasted at /login, per client address
    app.include_router(page_routes(keys, sessions, login_attempts, secure_cookies=config.tls.enabled))

    # Outermost last: headers (on every answer, the last guard's 500 included) -> log -> key ->
    # body limit -> routes.
    app.add_middleware(BodyLimit, max_bytes=config.limits.max_body_bytes)
    app.add_middleware(Authenticate, keys=keys, limits=config.auth, metrics=metrics, sessions=sessions)
    app.add_middleware(AccessLog, metrics=metrics)
    app.add_middleware(SecurityHeaders)
    return app
