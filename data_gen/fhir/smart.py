"""SMART Backend Services authorization for the FHIR REST client (client credentials, `private_key_jwt`).

The client signs a short-lived JWT assertion (RFC 7523) with its private key (RS384 or ES384, header
`kid` naming the public key the site registered) and trades it at the token endpoint for an access token:

    POST token_url  grant_type=client_credentials  scope=...
                    client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer
                    client_assertion=<JWT: iss = sub = client_id, aud = token_url, exp <= 5 min, fresh jti>

The token endpoint is configured, or read from `{base_url}/.well-known/smart-configuration`. It
passes the egress allowlist like the FHIR host (its token opens patient data), and one off loopback
must be https. The token is kept until `refresh_margin_s` before it expires; `invalidate()` drops it
(the REST client does so on a 401, then asks once more).

The private key file must be readable by its owner only (mode 0600 or 0400): anything else is refused,
naming the file. The key, the assertions and the tokens appear in no log, error or repr.
"""

from __future__ import annotations

import json
import logging
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from verdict.data_gen.formalizer import EgressPolicy, is_loopback

from .errors import FhirServerError

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("verdict.data_gen.fhir.smart")
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
AUTH_METHOD = "private_key_jwt"
MIN_RSA_BITS = 2048


class SmartAuthError(FhirServerError):
    """SMART Backend Services authorization failed: key file, discovery or the token endpoint."""


class SmartBackendConfig(BaseModel):
    """How this client authorizes at a SMART-enabled FHIR server (`smart:` in the FHIR REST config)."""

    model_config = ConfigDict(extra="forbid")

    client_id: str = Field(min_length=1, description="the client id the server's authorization server issued")
    private_key_file: Path = Field(
        description="PEM private key (RSA >= 2048 bits for RS384, EC P-384 for ES384), mode 0600; "
        "a relative path is taken from the working directory"
    )
    key_id: str = Field(min_length=1, description="`kid`: the id of its public key in the registered JWKS")
    algorithm: Literal["RS384", "ES384"] = Field("RS384", description="assertion signature algorithm")
    token_url: str | None = Field(
        None, description="token endpoint; null: read from {base_url}/.well-known/smart-configuration"
    )
    scope: str = Field(
        "system/*.rs",
        min_length=1,
        description="scopes asked for (SMART v2; a v1 server wants e.g. 'system/*.read'; write-back "
        "also needs 'system/ResearchSubject.cu')",
    )
    assertion_lifetime_s: int = Field(
        300, ge=10, le=300, description="assertion exp, seconds ahead (<= 5 min)"
    )
    refresh_margin_s: int = Field(60, ge=0, le=600, description="a token this close to expiring is renewed")

    @field_validator("token_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None:
            problem = token_url_problem(v)
            if problem:
                raise ValueError(problem)
        return v


def token_url_problem(url: str) -> str | None:
    """Why `url` cannot be a token endpoint (it receives the client's signed assertion), or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the token URL must be an http(s) URL with a host"
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return f"the token URL on '{parts.hostname}' must be https (http only on loopback)"
    return None


def load_private_key(path: Path, algorithm: str) -> Any:
    """The private key of `path` for `algorithm`; refused unless only its owner may read the file."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise SmartAuthError(f"SMART private key file {path}: cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise SmartAuthError(f"SMART private key file {path} is not a regular file")
    if mode & 0o077:
        raise SmartAuthError(
            f"SMART private key file {path} has mode {stat.S_IMODE(mode):04o}: group and others may "
            f"read it; refused (only its owner may: chmod 600 {path})"
        )
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except OSError as e:
        raise SmartAuthError(f"SMART private key file {path}: cannot be read ({e.strerror})") from None
    except (ValueError, TypeError):  # the library's message could quote the file: not passed on
        raise SmartAuthError(f"SMART private key file {path} is not an unencrypted PEM private key") from None
    if algorithm == "RS384":
        if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < MIN_RSA_BITS:
            raise SmartAuthError(
                f"SMART private key file {path}: RS384 needs an RSA key of >= {MIN_RSA_BITS} bits"
            )
    elif not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp384r1":
        raise SmartAuthError(f"SMART private key file {path}: ES384 needs an EC key on curve P-384")
    return key


def public_jwks(key_file: Path, key_id: str, algorithm: str) -> dict:
    """The JWKS (public part only) a site registers for this client at the authorization server."""
    from jwt.algorithms import ECAlgorithm, RSAAlgorithm

    key = load_private_key(key_file, algorithm).public_key()
    jwk = (RSAAlgorithm if algorithm == "RS384" else ECAlgorithm).to_jwk(key, as_dict=True)
    return {"keys": [{**jwk, "kid": key_id, "alg": algorithm, "use": "sig", "key_ops": ["verify"]}]}


class SmartBackendAuth:
    """Access tokens for one FHIR server, fetched with a signed assertion and kept until near expiry."""

    def __init__(
        self,
        cfg: SmartBackendConfig,
        base_url: str,
        *,
        http: httpx.Client,
        policy: EgressPolicy,
        clock: Callable[[], float] = time.time,
    ):
        self.cfg = cfg
        self._key = load_private_key(cfg.private_key_file, cfg.algorithm)  # refused before any request
        self._base_url = base_url
        self._http = http
        self._policy = policy
        self._clock = clock
        self._token_url: str | None = None
        self._token: str | None = None
        self._renew_at = 0.0
        self.tokens_fetched = 0
        if cfg.token_url is not None:
            self._token_url = self._allowed(cfg.token_url)

    def __repr__(self) -> str:
        return f"SmartBackendAuth(client_id={self.cfg.client_id!r}, token_url={self._token_url!r})"

    def authorization(self) -> str:
        """The `Authorization` header value: the kept token, or a new one."""
        if self._token is None or self._clock() >= self._renew_at:
            self._fetch()
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        """Forget the kept token (the FHIR server refused it): the next request asks for a new one."""
        self._token = None

    # -- the token endpoint -----------------------------------------------------------------------
    def _allowed(self, url: str) -> str:
        problem = token_url_problem(url)
        if problem:
            raise SmartAuthError(f"SMART token endpoint refused: {problem}")
        self._policy.check(
            url, carries_patient_text=True, what="a SMART token request (its token opens patient data)"
        )
        return url

    def token_url(self) -> str:
        """The configured token endpoint, or the one the server's smart-configuration names."""
        if self._token_url is None:
            self._token_url = self._allowed(self._discover())
        return self._token_url

    def _discover(self) -> str:
        import httpx

        url = f"{self._base_url}/.well-known/smart-configuration"
        try:
            r = self._http.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as e:
            raise SmartAuthError(
                f"FHIR server unreachable for GET /.well-known/smart-configuration ({type(e).__name__})"
            ) from None
        if r.status_code != 200:
            raise SmartAuthError(
                f"GET /.well-known/smart-configuration answered HTTP {r.status_code}: "
                "set smart.token_url in the FHIR REST config"
            )
        doc = _json(r.content)
        endpoint = doc.get("token_endpoint") if isinstance(doc, dict) else None
        if not isinstance(endpoint, str):
            raise SmartAuthError(
                "the server's smart-configuration names no token_endpoint: set smart.token_url"
            )
        methods = doc.get("token_endpoint_auth_methods_supported")
        if isinstance(methods, list) and AUTH_METHOD not in methods:
            raise SmartAuthError(f"the server's smart-configuration does not offer {AUTH_METHOD}")
        algs = doc.get("token_endpoint_auth_signing_alg_values_supported")
        if isinstance(algs, list) and self.cfg.algorithm not in algs:
            raise SmartAuthError(
                f"the server's smart-configuration does not accept {self.cfg.algorithm} "
                f"(it lists {', '.join(str(a) for a in algs)[:100]}): set smart.algorithm and the key"
            )
        return endpoint

    def assertion(self, token_url: str) -> str:
        """A signed client assertion for `token_url` (RFC 7523, SMART Backend Services)."""
        import jwt

        now = int(self._clock())
        claims = {
            "iss": self.cfg.client_id,
            "sub": self.cfg.client_id,
            "aud": token_url,
            "exp": now + self.cfg.assertion_lifetime_s,
            "iat": now,
            "jti": secrets.token_urlsafe(24),  # unique per assertion: the server refuses a replay
        }
        headers = {"kid": self.cfg.key_id, "typ": "JWT"}
        return jwt.encode(claims, self._key, algorithm=self.cfg.algorithm, headers=headers)

    def _fetch(self) -> None:
        import httpx

        url = self.token_url()
        form = {
            "grant_type": "client_credentials",
            "scope": self.cfg.scope,
            "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": self.assertion(url),
        }
        asked = self._clock()
        try:
            r = self._http.post(url, data=form, headers={"Accept": "application/json"})
        except httpx.HTTPError as e:
            raise SmartAuthError(f"SMART token endpoint {url} unreachable ({type(e).__name__})") from None
        if r.status_code != 200:
            raise SmartAuthError(
                f"SMART token endpoint {url} refused client '{self.cfg.client_id}' with HTTP "
                f"{r.status_code}{_oauth_error(r.content)}"
            )
        body = _json(r.content)  # holds the token: never quoted in an error
        token = body.get("access_token") if isinstance(body, dict) else None
        kind = body.get("token_type") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token or not isinstance(kind, str) or kind.lower() != "bearer":
            raise SmartAuthError(f"SMART token endpoint {url} answered without a bearer access_token")
        expires_in = body.get("expires_in")
        if not isinstance(expires_in, (int, float)) or isinstance(expires_in, bool) or expires_in <= 0:
            expires_in = self.cfg.assertion_lifetime_s  # unstated: assume the short life SMART asks for
        self._token = token
        self._renew_at = asked + max(expires_in - self.cfg.refresh_margin_s, 0)
        self.tokens_fetched += 1
        log.info("SMART access token for client %s, expires in %d s", self.cfg.client_id, int(expires_in))


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise SmartAuthError("the SMART authorization server answered something that is not JSON") from None


def _oauth_error(body: bytes) -> str:
    """': error (description)' of an OAuth error answer (RFC 6749 5.2), cut short; '' otherwise."""
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str):
        return ""
    desc = doc.get("error_description")
    return f": {doc['error'][:60]}" + (f" ({desc[:200]})" if isinstance(desc, str) and desc else "")
