"""A FHIR R4 REST client that only talks to allowlisted hosts.

Every URL (the base, each `link[next]` page, each attachment URL) goes through the project's egress
allowlist (`verdict.data_gen.formalizer.egress.EgressPolicy`) before a connection is opened: a host
that is not loopback or on `egress.allow_hosts` / $VERDICT_EGRESS_ALLOW is refused with
EgressRefused and nothing is sent. Redirects are not followed (a redirect could leave the
allowlist).

Authorization: with `smart` configured, SMART Backend Services (`smart.py`: a signed JWT assertion
traded for an access token, kept until it nears expiry; on a 401 the token is renewed once and the
request sent again, then a second 401 is an error). Without it, for development, the bearer token is
read from the environment variable `token_env` names, at request time. Neither is ever logged.

Per patient: `Patient/{id}/$everything` (paged), and when the server does not offer it (404, 400,
405, 501), `Patient/{id}` plus one search `TYPE?patient={id}` per resource type read (paged).

One write: `put_conditional` (FHIR conditional update, `PUT TYPE?identifier=system|value`): creates
the resource, or updates the one that holds that identifier, so writing it again never duplicates
it."""

from __future__ import annotations

import base64
import binascii
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from verdict.data_gen.formalizer import EgressPolicy, SourceEgress

from .errors import FhirServerError, FhirSourceError
from .smart import SmartBackendAuth, SmartBackendConfig
from .validate import MAX_ATTACHMENT_BYTES, READ_TYPES, parse_json

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("verdict.data_gen.fhir")
NO_EVERYTHING = (400, 404, 405, 501)  # statuses meaning "this server has no $everything"


class FhirRestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="FHIR base URL, e.g. https://fhir.hospital.example/r4")
    token_env: str | None = Field(
        "VERDICT_FHIR_TOKEN",
        description="for development: environment variable holding a bearer token (unset variable: no "
        "Authorization header; null: never send one); not read when `smart` is set",
    )
    smart: SmartBackendConfig | None = Field(
        None, description="SMART Backend Services: client credentials with a signed JWT assertion"
    )
    timeout_s: float = Field(30.0, gt=0, description="seconds per HTTP request")
    page_size: int = Field(100, ge=1, le=1000, description="_count asked for on searches")
    max_pages: int = Field(1000, ge=1, description="pages followed per search before stopping with a problem")
    use_everything: bool = Field(True, description="try Patient/{id}/$everything first")
    max_attachment_bytes: int = Field(
        MAX_ATTACHMENT_BYTES, ge=1, description="largest attachment read by URL"
    )
    egress: SourceEgress

    @field_validator("base_url")
    @classmethod
    def _http(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http(s) URL with a host")
        return v.rstrip("/")


def load_rest_config(path: Path, base_url: str) -> FhirRestConfig:
    """A REST client config YAML (`FhirRestConfig`, `--config` / `--fhir-config`); `base_url` is the
    server named on the command line."""
    from verdict.core import configs

    data = configs.read_yaml(path)
    data["base_url"] = base_url
    return configs.build(FhirRestConfig, data, where=f"FHIR REST config {path.name}")


class FhirRestClient:
    """Reads one patient's resources (or the server's patient ids) from a FHIR server."""

    def __init__(
        self,
        cfg: FhirRestConfig,
        *,
        policy: EgressPolicy | None = None,
        clock: Callable[[], float] = time.time,
        bearer: str | None = None,
    ):
        self.cfg = cfg
        self._bearer = bearer  # a token the caller was handed (a CDS Hooks call's fhirAuthorization)
        self.policy = policy or EgressPolicy.from_config(cfg.egress)
        self._check(cfg.base_url)  # refused before the client exists, so before any request
        import httpx

        self._http = httpx.Client(timeout=cfg.timeout_s, follow_redirects=False)
        self.smart: SmartBackendAuth | None = None
        if cfg.smart is not None:
            try:  # key file and a configured token URL checked here, before any request
                self.smart = SmartBackendAuth(
                    cfg.smart, cfg.base_url, http=self._http, policy=self.policy, clock=clock
                )
            except BaseException:
                self._http.close()
                raise
        self.requests = 0
        self._has_everything: bool | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> FhirRestClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- HTTP ------------------------------------------------------------------------------------
    def _check(self, url: str) -> None:
        self.policy.check(url, carries_patient_text=True, what="a FHIR request")

    def _own(self, url: str) -> bool:
        """Whether `url` is on the FHIR server itself: only there does its token go."""
        a, b = urlsplit(url), urlsplit(self.cfg.base_url)
        return (a.scheme, a.netloc.lower()) == (b.scheme, b.netloc.lower())

    def _headers(self, url: str) -> dict[str, str]:
        headers = {"Accept": "application/fhir+json"}
        if not self._own(url):  # an attachment or page elsewhere (allowlisted) never gets the token
            return headers
        if self._bearer:  # a token the caller was handed for this server
            headers["Authorization"] = f"Bearer {self._bearer}"
        elif self.smart is not None:
            headers["Authorization"] = self.smart.authorization()
        elif self.cfg.token_env:
            token = os.environ.get(self.cfg.token_env)
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return headers

    def _url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
        return f"{self.cfg.base_url}/{path_or_url.lstrip('/')}"

    def get(self, path_or_url: str, params: dict | None = None) -> tuple[int, bytes, str | None]:
        """(status, body, content type); the URL is checked against the allowlist first."""
        url = self._url(path_or_url)
        self._check(url)
        what = urlsplit(url).path  # ids only: no query (never patient text), no host credentials
        r = self._send("GET", url, what, params=params)
        return r.status_code, r.content, r.headers.get("content-type")

    def _send(self, method: str, url: str, what: str, **kw: Any) -> httpx.Response:
        """One request; under SMART, a 401 renews the token and sends it once more."""
        import httpx

        extra = kw.pop("headers", {})
        for attempt in (1, 2):
            try:
                r = self._http.request(method, url, headers={**self._headers(url), **extra}, **kw)
            except httpx.HTTPError as e:
                raise FhirServerError(
                    f"FHIR server unreachable for {method} {what} ({type(e).__name__})"
                ) from None
            self.requests += 1
            if r.status_code != 401 or self.smart is None or attempt == 2 or not self._own(url):
                return r
            log.info("FHIR server answered 401 to %s %s: renewing the SMART access token", method, what)
            self.smart.invalidate()
        return r

    def get_json(self, path_or_url: str, params: dict | None = None, *, allow: tuple[int, ...] = ()) -> Any:
        status, body, _ = self.get(path_or_url, params)
        if status in allow:
            return None
        return self._answer("GET", urlsplit(self._url(path_or_url)).path, status, body)

    def _answer(self, method: str, what: str, status: int, body: bytes) -> Any:
        if (status == 401 or status == 403) and self.smart is not None:
            smart = self.cfg.smart
            raise FhirServerError(
                f"FHIR server refused {method} {what} with HTTP {status}"
                + (" again with a new SMART access token" if status == 401 else "")
                + f": check that client '{smart.client_id}' is registered and granted scope '{smart.scope}'"
            )
        if status == 401 or status == 403:
            raise FhirServerError(
                f"FHIR server refused {method} {what} with HTTP {status}: check the bearer token "
                f"in ${self.cfg.token_env or '(no token_env)'}"
            )
        if status >= 400:
            raise FhirServerError(f"FHIR server answered HTTP {status} for {method} {what}")
        return parse_json(body, f"FHIR response to {method} {what}")

    # -- writes ----------------------------------------------------------------------------------
    def put_conditional(self, resource: dict, system: str, value: str) -> tuple[bool, Any]:
        """(created, stored resource): `PUT TYPE?identifier=system|value` with `resource` (no `id`:
        the server assigns it on create). The URL is checked against the allowlist first."""
        rtype = resource["resourceType"]
        url = self._url(rtype)
        self._check(url)
        r = self._send(
            "PUT",
            url,
            rtype,
            params={"identifier": f"{system}|{value}"},
            json=resource,
            headers={"Content-Type": "application/fhir+json"},
        )
        if r.status_code == 412:  # more than one resource holds the identifier: never pick one
            raise FhirServerError(f"FHIR server holds several {rtype} with identifier {system}|{value}")
        if 400 <= r.status_code < 500 and r.status_code not in (401, 403):
            raise FhirServerError(
                f"FHIR server refused PUT {rtype} with HTTP {r.status_code}{_issue(r.content)}"
            )
        return r.status_code == 201, self._answer("PUT", f"/{rtype}", r.status_code, r.content)

    # -- reads -----------------------------------------------------------------------------------
    def search(self, path: str, params: dict, problems: list[str]) -> list[Any]:
        """Every resource of a search, following link[next]."""
        return self._pages(self.get_json(path, {**params, "_count": self.cfg.page_size}), path, problems)

    def patient_ids(self, problems: list[str]) -> list[str]:
        found = self.search("Patient", {}, problems)
        return sorted({r["id"] for r in found if isinstance(r, dict) and isinstance(r.get("id"), str)})

    def patient_resources(self, patient_id: str, problems: list[str]) -> list[Any]:
        """The patient's resources of the types read: $everything, or per-type searches."""
        pid = quote(patient_id, safe="")
        if self.cfg.use_everything and self._has_everything is not False:
            first = self.get_json(f"Patient/{pid}/$everything", allow=NO_EVERYTHING)
            self._has_everything = first is not None  # asked once per client, not once per patient
            if first is not None:
                return [
                    r
                    for r in self._pages(first, f"Patient/{pid}/$everything", problems)
                    if isinstance(r, dict) and r.get("resourceType") in READ_TYPES
                ]
            log.info("FHIR server has no $everything; falling back to per-type searches")
        patient = self.get_json(f"Patient/{pid}", allow=(404,))
        if patient is None:
            raise FhirSourceError(f"Patient/{patient_id} is not on the FHIR server")
        out = [patient]
        for rtype in READ_TYPES:
            if rtype != "Patient":
                out += self.search(rtype, {"patient": patient_id}, problems)
        return out

    def _pages(self, page: Any, path: str, problems: list[str]) -> list[Any]:
        """The resources of a Bundle page and of every page after it (link[next])."""
        out: list[Any] = []
        for _ in range(self.cfg.max_pages):
            if not isinstance(page, dict) or page.get("resourceType") != "Bundle":
                problems.append(f"GET {path}: the answer is not a Bundle")
                return out
            out += [
                e.get("resource")
                for e in page.get("entry") or []
                if isinstance(e, dict) and e.get("resource")
            ]
            nxt = next(
                (
                    lk.get("url")
                    for lk in page.get("link") or []
                    if isinstance(lk, dict) and lk.get("relation") == "next" and lk.get("url")
                ),
                None,
            )
            if nxt is None:
                return out
            page = self.get_json(nxt)
        problems.append(f"GET {path}: stopped after {self.cfg.max_pages} pages (fhir max_pages)")
        return out

    def fetch_attachment(self, url: str) -> tuple[bytes, str | None]:
        """An attachment by URL (absolute, or relative to the base, e.g. Binary/1). A FHIR `Binary`
        answered as JSON gives its decoded `data` and its `contentType`."""
        status, body, content_type = self.get(url)
        if status >= 400:
            raise FhirServerError(f"attachment URL answered HTTP {status}")
        media = (content_type or "").split(";")[0].strip().lower()
        if media in ("application/fhir+json", "application/json"):
            binary = parse_json(body, "attachment URL answer")
            if not isinstance(binary, dict) or binary.get("resourceType") != "Binary":
                raise FhirServerError("attachment URL answered JSON that is not a FHIR Binary")
            try:
                body = base64.b64decode(binary.get("data") or "", validate=True)
            except (binascii.Error, ValueError):
                raise FhirServerError("attachment URL answered a Binary whose data is not base64") from None
            content_type = binary.get("contentType") if isinstance(binary.get("contentType"), str) else None
        if len(body) > self.cfg.max_attachment_bytes:
            raise FhirServerError(
                f"attachment is {len(body) / 2**20:.1f} MiB, over the limit of "
                f"{self.cfg.max_attachment_bytes / 2**20:.0f} MiB"
            )
        return body, content_type


def _issue(body: bytes) -> str:
    """': <first issue>' of an OperationOutcome answering a write (what we sent holds no patient text)."""
    try:
        issue = parse_json(body, "OperationOutcome")["issue"][0]
        text = (issue.get("details") or {}).get("text") or issue.get("diagnostics") or issue.get("code")
        where = ", ".join(issue.get("expression") or [])
    except (FhirSourceError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    return f": {str(text)[:200]}" + (f" ({where[:100]})" if where else "")
