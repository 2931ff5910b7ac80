"""HTTP routes of the CDS Hooks 2.0 service; the logic is in `serving.py` (`CdsHooks`, serve/dependencies.py).

GET  /cds-services                   discovery: the patient-view service
POST /cds-services/{id}              a patient-view call -> cards from decisions already made
POST /cds-services/{id}/feedback     accepted / overridden cards -> the audit chain (and flags)

These routes take no API key: the EHR signs each call with a JWT (`client_jwt.py`). `JwtFirst`
(ASGI, inside the key check, which leaves the /cds-services paths to it) checks it before the body is
read, so an unauthenticated call learns nothing of how its input would be judged.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..api_config import CdsClient
from ..dependencies import CdsHooks, cds_hooks_service
from ..error_mapping import error_body, error_responses
from ..errors import ServiceError
from ..middleware import send_json
from .client_jwt import JwtRefused
from .protocol import CdsResponse, CdsServices, FeedbackRequest, FeedbackResponse, HookRequest
from .serving import CdsHooksService

PREFIX = "/cds-services"
jwt_bearer = HTTPBearer(
    auto_error=False, scheme_name="CdsClientJwt", description="the EHR's signed JWT (CDS Hooks 2.0)"
)


def under_prefix(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class JwtFirst:
    """ASGI: a /cds-services call's JWT verified (in a worker thread: a JWKS may be fetched) before
    the route reads its body; refused with 401 naming the problem. The client goes to the route in
    `request.state.cds_client`. While the service is off, the route answers 404."""

    def __init__(self, app, metrics=None):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and under_prefix(scope.get("path", "")):
            svc: CdsHooksService = scope["app"].state.cds_hooks
            if svc.enabled:
                auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
                try:
                    found = await asyncio.to_thread(svc.authenticate, auth, svc.public_url + scope["path"])
                except ServiceError as e:
                    if self.metrics is not None:
                        self.metrics.errors.labels(e.code).inc()
                    headers = [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
                    return await send_json(send, e.status, error_body(e).model_dump(), headers)
                scope.setdefault("state", {})["cds_client"] = found
        return await self.app(scope, receive, send)


async def client(
    request: Request, _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(jwt_bearer)]
) -> CdsClient:
    """The EHR whose JWT `JwtFirst` accepted (404 while the service is off)."""
    hooks = cds_hooks_service(request)
    hooks.check_service(request.path_params.get("service_id", hooks.cfg.service_id))
    found = getattr(request.state, "cds_client", None)
    if found is None:
        raise JwtRefused("missing JWT: the EHR signs each hook call (Authorization: Bearer <JWT>)")
    return found


Client = Annotated[CdsClient, Depends(client)]
_ERRORS = error_responses(
    {
        401: "no JWT, or one refused: unknown issuer, wrong audience, expired, no jti, a replayed jti, ...",
        404: "no such CDS service, or the CDS Hooks service is off (api.cds_hooks.clients)",
        422: "invalid call: every invalid field is named (a fhirServer off the egress allowlist included)",
        503: "too many unexpired tokens to remember; try again shortly",
    }
)

router = APIRouter(tags=["cds-hooks"])


@router.get(PREFIX, response_model=CdsServices, response_model_exclude_none=True, responses=_ERRORS)
async def discovery(hooks: CdsHooks, _client: Client) -> CdsServices:
    """CDS Hooks discovery: the `patient-view` service and the prefetch it asks for."""
    return hooks.discovery()


@router.post(PREFIX + "/{service_id}", response_model=CdsResponse, response_model_exclude_none=True,
             responses=_ERRORS)  # fmt: skip
async def call_hook(service_id: str, req: HookRequest, hooks: CdsHooks, client: Client) -> CdsResponse:
    """A `patient-view` call: one card per eligible or near-miss trial, best first, read from the
    decisions already made within `api.cds_hooks.answer_within_s` (no model call); a patient not yet
    screened against every registered trial is queued for a screening (empty list until it is done)."""
    return await hooks.cards(service_id, req, client)


@router.post(PREFIX + "/{service_id}/feedback", response_model=FeedbackResponse, responses=_ERRORS)
async def feedback(
    service_id: str, req: FeedbackRequest, hooks: CdsHooks, client: Client
) -> FeedbackResponse:
    """Outcomes of cards: each is recorded in the decision's lineage (audit chain); an override with
    a reason is also a flag on the decision for its reviewers (GET /v1/trials/{id}/flags)."""
    return await hooks.feedback(service_id, req, client)
