"""The role check of a route: `Depends(require("match", "audit"))` gives the caller's key entry when
it holds one of the roles (admin holds all), else 401 (no valid key) or 403 (the role is missing).

The key itself was checked at the edge (`auth.Authenticate`), before the body was read; this only
reads the result and checks the role, so every router (app.py, reviews/router.py) shares one rule.
FastAPI parses and validates a body and query before it runs any dependency, so `RoleFirst` (ASGI,
right after the key check) reads the same roles off the matched route and refuses a key without
them (403) before the body is read: such a key never learns how its input would have been judged.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.routing import Match

from .api_keys import KeyEntry
from .errors import ServiceError
from .middleware import send_json

bearer = HTTPBearer(auto_error=False, description="an API key: `verdict serve keys add --role ...`")


class Unauthorized(ServiceError):
    status, code = 401, "unauthorized"


class Forbidden(ServiceError):
    status, code = 403, "forbidden"


def lacks(roles: tuple[str, ...]) -> str:
    return f"this key lacks the role {' or '.join(roles)}"


def require(*roles: str):
    async def dependency(
        request: Request, _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> KeyEntry:
        entry = getattr(request.state, "key_entry", None)
        if entry is None:
            raise Unauthorized("missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
        if not any(entry.allows(r) for r in roles):
            raise Forbidden(lacks(roles))
        return entry

    dependency.roles = roles  # read by RoleFirst, before the body is parsed
    return dependency


def roles_of(route) -> tuple[str, ...] | None:
    """The roles a route's `require(...)` dependency asks for (None: the route checks no role)."""
    dependant = getattr(route, "dependant", None)
    for dep in getattr(dependant, "dependencies", ()):
        roles = getattr(dep.call, "roles", None)
        if roles is not None:
            return roles
    return None


class RoleFirst:
    """ASGI, between the key check and the body limit: the request's route, and its role refused
    first. Setting `scope["route"]` here also lets the access log name the route of an answer given
    before routing (a 413 of the body limit)."""

    def __init__(self, app, routes: list, metrics=None):
        self.app = app
        self.routes = routes  # the included routers' own routes (each matches a scope by itself)
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            route = next((r for r in self.routes if r.matches(scope)[0] == Match.FULL), None)
            roles = roles_of(route) if route is not None else None
            if route is not None:
                scope["route"] = route
            entry = (scope.get("state") or {}).get("key_entry")
            if roles and entry is not None and not any(entry.allows(r) for r in roles):
                if self.metrics is not None:
                    self.metrics.errors.labels(Forbidden.code).inc()
                return await send_json(
                    send, Forbidden.status, {"error": Forbidden.code, "message": lacks(roles), "problems": []}
                )
        return await self.app(scope, receive, send)
