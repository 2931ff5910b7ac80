"""The one way to an OMOP database: the URL is checked before any connection is opened.

- It carries no password (a password in a URL lands in shell histories and process lists): it
  comes from the config's `password_env` or libpq's own PGPASSWORD / ~/.pgpass.
- Every host libpq would connect to (`host`, `hostaddr`, several comma-separated ones, or PGHOST /
  PGHOSTADDR when the URL names none) passes the project's egress allowlist
  (`verdict.data_gen.formalizer.egress`): loopback, a local socket directory, or a host the site allowed.
  A `service` (pg_service.conf) entry is refused: its hosts could not be checked.
- What is shown of a URL is `db_label`: scheme, user, host, port and database, never a password.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from verdict.data_gen.formalizer import EgressPolicy

from .config import OmopConfig
from .errors import OmopSourceError


def db_label(url: str) -> str:
    """postgresql://HOST[:PORT]/DB: what logs and messages may show of a database URL."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"


def target_hosts(url: str) -> list[str]:
    """Every host (or socket directory) libpq would connect to for `url`."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as e:  # a malformed URL; the URL is not repeated (it may hold a password)
        raise OmopSourceError(
            f"the OMOP database URL {db_label(url)} cannot be parsed ({type(e).__name__})"
        ) from None
    if params.get("password"):
        raise OmopSourceError(
            f"the OMOP database URL {db_label(url)} carries a password: put it in the environment "
            "(the config's password_env, default $VERDICT_OMOP_PASSWORD, or PGPASSWORD) instead"
        )
    if params.get("service") or (not params.get("host") and os.environ.get("PGSERVICE")):
        raise OmopSourceError("a pg_service.conf service is not read: give the host in the URL")
    hosts = str(params.get("host") or os.environ.get("PGHOST") or "").split(",")
    addrs = str(params.get("hostaddr") or os.environ.get("PGHOSTADDR") or "").split(",")
    found = [h.strip() for h in hosts + addrs if h.strip()]
    return found or ["/"]  # no host at all: libpq's default local socket


def check_egress(cfg: OmopConfig, policy: EgressPolicy | None = None) -> None:
    """EgressRefused unless every host of `cfg.url` is allowed (a socket directory is local)."""
    policy = policy or EgressPolicy.from_config(cfg.egress)
    for host in target_hosts(cfg.url):
        if host.startswith("/") or host.startswith("@"):  # a Unix-domain socket: this machine
            continue
        name = f"[{host}]" if ":" in host else host  # an IPv6 address
        policy.check(f"postgresql://{name}/", carries_patient_text=True, what="an OMOP database connection")


def pg_problem(e: Exception) -> str:
    """PostgreSQL's first line about a failure (it names tables, columns, roles; never row values)."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def connect(cfg: OmopConfig, policy: EgressPolicy | None = None):
    """A read-only psycopg connection to `cfg.url`, after the allowlist check."""
    check_egress(cfg, policy)  # before any connection: EgressRefused, nothing was sent
    kwargs: dict = {"connect_timeout": cfg.connect_timeout_s, "application_name": "verdict-omop"}
    password = cfg.password()
    if password:
        kwargs["password"] = password
    try:
        return psycopg.connect(cfg.url, **kwargs)
    except psycopg.Error as e:  # libpq's message may name the host; never the password (not in the URL)
        raise OmopSourceError(
            f"cannot connect to the OMOP database {db_label(cfg.url)} ({type(e).__name__}: {pg_problem(e)})"
        ) from None
