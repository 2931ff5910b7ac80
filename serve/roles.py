"""The role check of a route: `Depends(require("match", "audit"))` gives the caller's key entry when
it holds one of the roles (admin holds all), else 401 (no valid key) or 403 (the role is missing).

The key itself was checked at the edge (`auth.Authenticate`), before the body was read; this only
reads the result and checks the role, so every router (app.py, reviews/router.py) shares one rule.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .api_keys import KeyEntry
from .errors import ServiceError

bearer = HTTPBearer(auto_error=False, description="an API key: `verdict serve keys add --role ...`")


class Unauthorized(ServiceError):
    status, code = 401, "unauthorized"


class Forbidden(ServiceError):
    status, code = 403, "forbidden"


def require(*roles: str):
    async def dependency(
        request: Request, _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> KeyEntry:
        entry = getattr(request.state, "key_entry", None)
        if entry is None:
            raise Unauthorized("missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
        if not any(entry.allows(r) for r in roles):
            raise Forbidden(f"this key lacks the role {' or '.join(roles)}")
        return entry

    return dependency
