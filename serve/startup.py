"""What the matching API checks and says before it serves: the absolute path of every file it uses,
and a refusal to start on a configured audit store or key file that does not exist (a typo, or a
command started from another directory, must not yield a new empty store and no keys) unless told
to create them (`--init`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from .api_config import ApiConfig
from .api_keys import KeyStore
from .preflight import PreflightError


def _store_text(audit_db: str) -> str:
    if "://" in audit_db:
        u = urlsplit(audit_db)
        return f"{u.scheme}://{u.username + '@' if u.username else ''}{u.hostname}:{u.port or 5432}{u.path}"
    return str(Path(audit_db).absolute())


def files_used(config: ApiConfig, source: str | None = None) -> list[tuple[str, str]]:
    """(what, absolute path or URL) of every file the service reads or writes."""
    rows = []
    if source:
        rows.append(("serve config", str(Path(source).absolute())))
    rows.append(("audit store", _store_text(config.audit_db)))
    rows.append(("API keys", str(Path(config.api_keys).absolute())))
    rows.append(("log", str(Path(config.log_file).absolute()) if config.log_file else "stderr"))
    if config.tls.enabled:
        rows.append(("TLS certificate", str(Path(config.tls.certfile).absolute())))
        rows.append(("TLS key", str(Path(config.tls.keyfile).absolute())))
    return rows


def check_api_files(config: ApiConfig, init: bool) -> None:
    """Refuse a missing SQLite audit store or key file (both named in one error) unless ``init``;
    with ``init``, create the key file empty (the store is created when the service opens it)."""

    missing = []
    if "://" not in config.audit_db and config.audit_db != ":memory:" and not Path(config.audit_db).exists():
        missing.append(f"audit store {Path(config.audit_db).absolute()} does not exist")
    if not Path(config.api_keys).exists():
        missing.append(f"API key file {Path(config.api_keys).absolute()} does not exist")
    if config.tls.enabled:
        for f in (config.tls.certfile, config.tls.keyfile):
            if not Path(f).is_file():
                missing.append(f"TLS file {Path(f).absolute()} does not exist")
    creatable = [m for m in missing if not m.startswith("TLS")]
    if missing and (not init or len(creatable) != len(missing)):
        hint = "" if len(creatable) != len(missing) else "; pass --init to create them (a first start)"
        raise PreflightError(f"the matching API will not start{hint}", missing)
    if init:
        KeyStore(config.api_keys).create_empty()
