"""Who may call the CDS Hooks service: the EHR signs each call with a JWT (CDS Hooks 2.0, "Trusting
CDS Clients"), checked here with PyJWT against the issuer's configured JSON Web Key Set.

    verifier = ClientJwt(config.cds_hooks, audience=config.public_url, egress=services.formalizers.egress)
    client = verifier.verify(authorization_header, endpoint_url)   # -> CdsClient, or JwtRefused (401)

Refused, each with its own message: no token, a malformed one, an unknown issuer (`iss` not a
configured client), no key for its `kid`, a bad signature or algorithm, the wrong audience (`aud` must
be `api.public_url` or the URL of the endpoint called), an expired token, a token without `jti`, and
a `jti` seen before from that issuer while its token is still valid (a replay). Remembered ids live in
this process: replicas behind a load balancer each remember their own.

A JWKS URL must pass the egress allowlist (checked at start) and is fetched without redirects,
kept for `jwks_refresh_s`, and fetched again at most that often when a token names an unknown key.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import jwt
from verdict.data_gen.formalizer import EgressPolicy

from ..api_config import CdsClient, CdsHooksConfig
from ..errors import ServeConfigError, ServiceError


class JwtRefused(ServiceError):
    """The hook call's JWT is missing or not acceptable (401): the message names the problem."""

    status, code = 401, "unauthorized"

    def __init__(self, message: str):
        super().__init__(message, headers={"WWW-Authenticate": 'Bearer realm="cds-hooks"'})


class JwtBusy(ServiceError):
    status, code = 503, "too_many_tokens"


class KeySet:
    """One client's signing keys by `kid`, from its file or URL."""

    def __init__(self, client: CdsClient, cfg: CdsHooksConfig, clock=time.monotonic):
        self.client, self.cfg, self.clock = client, cfg, clock
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = threading.Lock()
        if client.jwks_file:
            try:
                self._keys = self._parse(Path(client.jwks_file).read_text())
            except (OSError, ValueError) as e:
                raise ServeConfigError(
                    f"cds_hooks client '{client.name}': its jwks_file is unusable ({type(e).__name__}: {e})"
                ) from None

    def _parse(self, text: str) -> dict[str | None, jwt.PyJWK]:
        try:
            keys = jwt.PyJWKSet.from_json(text).keys
        except (jwt.PyJWTError, json.JSONDecodeError) as e:
            raise ValueError(f"not a JSON Web Key Set: {e}") from None
        return {k.key_id: k for k in keys}

    def _fetch(self) -> None:
        try:
            r = httpx.get(self.client.jwks_url, timeout=self.cfg.jwks_timeout_s, follow_redirects=False)
            r.raise_for_status()
            self._keys = self._parse(r.text)
        except (httpx.HTTPError, ValueError):
            pass  # the keys kept so far stay; an unknown kid is refused below, naming the issuer
        self._fetched_at = self.clock()

    def key(self, kid: str | None) -> jwt.PyJWK | None:
        with self._lock:
            if self.client.jwks_url:
                now = self.clock()
                stale = self._fetched_at is None or now - self._fetched_at > self.cfg.jwks_refresh_s
                if stale:
                    self._fetch()
            if kid is None and len(self._keys) == 1:
                return next(iter(self._keys.values()))
            return self._keys.get(kid)


class ClientJwt:
    def __init__(self, cfg: CdsHooksConfig, audience: str | None, egress: EgressPolicy, clock=time.time):
        self.cfg, self.audience, self.clock = cfg, audience, clock
        for c in cfg.clients:
            if c.jwks_url:  # checked before any fetch, as for a FHIR host
                host = egress.refused_host(c.jwks_url)
                if host is not None:
                    raise ServeConfigError(
                        f"refusing to start: cds_hooks client '{c.name}': its jwks_url host '{host}' is not "
                        "on the site's egress allowlist (api.egress.allow_hosts)"
                    )
        self.clients = {c.issuer: c for c in cfg.clients}
        self.key_sets = {c.issuer: KeySet(c, cfg) for c in cfg.clients}
        self._seen: dict[tuple[str, str], float] = {}  # (iss, jti) -> exp
        self._lock = threading.Lock()

    def verify(self, authorization: str | None, endpoint_url: str) -> CdsClient:
        """The client whose JWT this is, or JwtRefused naming the problem. Reads a JWKS URL at most
        every `jwks_refresh_s`: call it in a thread."""
        token = _bearer(authorization)
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise JwtRefused("malformed JWT: not a signed JSON Web Token") from None
        iss = claims.get("iss")
        client = self.clients.get(iss) if isinstance(iss, str) else None
        if client is None:
            shown = iss[:100] if isinstance(iss, str) else "none"
            raise JwtRefused(f"unknown issuer '{shown}': not a client in api.cds_hooks.clients")
        kid = header.get("kid")
        key = self.key_sets[iss].key(kid if isinstance(kid, str) else None)
        if key is None:
            raise JwtRefused(f"no key '{str(kid)[:100]}' in the JWKS of issuer '{iss}'")
        audiences = [self.audience, endpoint_url] if self.audience else [endpoint_url]
        try:
            verified = jwt.decode(
                token,
                key,
                algorithms=list(client.algorithms),
                audience=audiences,
                issuer=iss,
                leeway=self.cfg.jwt_leeway_s,
                options={"require": ["iss", "aud", "exp", "iat", "jti"]},
            )
        except jwt.ExpiredSignatureError:
            raise JwtRefused("expired JWT: its exp has passed") from None
        except jwt.MissingRequiredClaimError as e:
            raise JwtRefused(f"the JWT has no '{e.claim}' claim (CDS Hooks 2.0 requires it)") from None
        except jwt.InvalidAudienceError:
            raise JwtRefused(
                f"wrong audience: the JWT's aud must be {self.audience} (api.public_url)"
            ) from None
        except jwt.ImmatureSignatureError:
            raise JwtRefused("the JWT is not valid yet (iat or nbf in the future)") from None
        except jwt.InvalidAlgorithmError:
            raise JwtRefused(f"the JWT's algorithm is not one of {', '.join(client.algorithms)}") from None
        except jwt.InvalidSignatureError:
            raise JwtRefused(f"bad signature: not signed by a key of issuer '{iss}'") from None
        except jwt.PyJWTError as e:
            raise JwtRefused(f"invalid JWT ({type(e).__name__})") from None
        jti = verified["jti"]
        if not isinstance(jti, str) or not jti:
            raise JwtRefused("the JWT's jti is empty")
        self._remember(iss, jti[:200], float(verified["exp"]))
        return client

    def _remember(self, iss: str, jti: str, exp: float) -> None:
        now = self.clock()
        with self._lock:
            seen = self._seen.get((iss, jti))
            if seen is not None and seen + self.cfg.jwt_leeway_s >= now:
                raise JwtRefused(f"replayed JWT: jti '{jti[:100]}' was already used by issuer '{iss}'")
            if len(self._seen) >= self.cfg.max_remembered_jti:
                self._seen = {k: t for k, t in self._seen.items() if t + self.cfg.jwt_leeway_s >= now}
                if len(self._seen) >= self.cfg.max_remembered_jti:
                    raise JwtBusy(
                        "too many unexpired hook tokens to remember (api.cds_hooks.max_remembered_jti): "
                        "try again shortly"
                    )
            self._seen[(iss, jti)] = exp


def _bearer(authorization: str | None) -> str:
    value = (authorization or "").strip()
    if value[:7].lower() != "bearer " or not value[7:].strip():
        raise JwtRefused("missing JWT: the EHR signs each hook call (Authorization: Bearer <JWT>)")
    return value[7:].strip()
