"""`verdict serve audit ...`: check and set up the audit store.

verdict serve audit verify --config NAME            (or --db PATH|postgresql://URL)
verdict serve audit verify --db URL --head SEQ:HASH  a head recorded earlier must still be in the chain
verdict serve audit backup --config NAME --out FILE   a verified 0600 copy while the service runs
verdict serve audit restore --from FILE --to PATH --head SEQ:HASH
verdict serve audit setup-postgres --url ADMIN_URL --writer ROLE

Imports inside the commands: a part's cli module imports only typer (and light modules) at module
level, so that `verdict --help` and the other parts' commands never load this part's heavy optional
dependencies (fastapi, vLLM, httpx, psycopg, jinja2: the serve and slurm extras; verdict/cli.py).
"""

from __future__ import annotations

from pathlib import Path

import typer
from verdict.core.cli_errors import fail

audit_app = typer.Typer(help="the append-only audit store: verify it, set it up", no_args_is_help=True)
CONFIG_HELP = "serve config: NAME in configs/serve/ or a YAML path (its api.audit_db)"


@audit_app.command("verify")
def verify_cmd(
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    db: str | None = typer.Option(None, "--db", help="a SQLite file or a postgresql:// URL"),
    password_env: str | None = typer.Option(
        None, help="with a --db URL: environment variable with the password (default: PGPASSWORD)"
    ),
    head: str | None = typer.Option(None, help="SEQ:HASH printed by an earlier verify: must still match"),
) -> None:
    """Check the database's own protections (triggers) and the hash chain over every row. Exit 0 and the
    head (SEQ:HASH, worth recording elsewhere) when intact; exit 1 naming the first bad row."""
    from ..api_config import ApiConfig
    from .store import open_store

    if (config is None) == (db is None):
        fail("give --config NAME or --db PATH|URL")
    if config is not None:
        from ..config import load_serve_config

        api = load_serve_config(config).require("api")
    else:
        api = ApiConfig(audit_db=db, audit_password_env=password_env)
    store = open_store(api, read_only=True)
    try:
        report = store.verify(head)
    finally:
        store.close()
    counts = ", ".join(f"{n} {t}" for t, n in report.rows.items())
    if not report.ok:
        for p in report.problems:
            typer.echo(f"FAIL: {p}", err=True)
        typer.echo(f"audit store {store.backend}: NOT intact ({counts} read)", err=True)
        raise typer.Exit(1)
    typer.echo(f"audit store {store.backend}: intact, {counts}; head {report.head_text}", err=True)
    typer.echo(report.head_text)


@audit_app.command("backup")
def backup_cmd(
    out: Path = typer.Option(..., "--out", help="the backup file to write (new; created 0600)"),
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    db: str | None = typer.Option(None, "--db", help="a SQLite audit store file"),
) -> None:
    """Copy a SQLite audit store with SQLite's backup API (safe while the service writes), verify the
    copy and print its head (SEQ:HASH): record it, a restore is checked against it. PostgreSQL:
    pg_dump (docs/deploy.md)."""
    from .backup import backup
    from .store import is_postgres_url

    location = _location(config, db)
    if is_postgres_url(location):
        fail("a PostgreSQL audit store is backed up with pg_dump -Fc (docs/deploy.md, Backups)")
    report = backup(location, out)
    counts = ", ".join(f"{n} {t}" for t, n in report.rows.items())
    typer.echo(f"backup {out.absolute()} (0600): intact, {counts}; head {report.head_text}", err=True)
    # The quote-hash secret goes with the store: without it, hashes of new rows cannot be compared
    # with the backed-up ones (store_notes: false keeps only keyed hashes).
    key = _hash_key(config)
    if key is None:
        typer.echo(
            "note: the quote-hash key (api.audit_hash_key) is not in this backup: give --config to copy "
            "it, or copy it yourself, mode 0600",
            err=True,
        )
    elif key.exists():
        copy = out.with_name(out.name + ".hash.key")
        copy.touch(mode=0o600, exist_ok=False)
        copy.write_bytes(key.read_bytes())
        typer.echo(f"quote-hash key {key.absolute()} copied to {copy.absolute()} (0600)", err=True)
    typer.echo(report.head_text)


def _hash_key(config: str | None) -> Path | None:
    """The configured quote-hash key file (None without a serve config)."""
    if config is None:
        return None
    from ..config import load_serve_config

    return Path(load_serve_config(config).require("api").audit_hash_key_path)


@audit_app.command("restore")
def restore_cmd(
    from_: Path = typer.Option(..., "--from", help="a backup written by `verdict serve audit backup`"),
    to: Path = typer.Option(..., "--to", help="where the store goes (a new file; api.audit_db)"),
    head: str = typer.Option(..., help="the head (SEQ:HASH) the backup printed, recorded elsewhere"),
) -> None:
    """Put a backup in place, verified against its recorded head before and after the copy."""
    from .backup import restore

    report = restore(from_, to, head)
    typer.echo(f"restored {to.absolute()} (0600): intact, head {report.head_text}", err=True)


def _location(config: str | None, db: str | None) -> str:
    if (config is None) == (db is None):
        fail("give --config NAME or --db PATH")
    if db is not None:
        return db
    from ..config import load_serve_config

    return load_serve_config(config).require("api").audit_db


@audit_app.command("setup-postgres")
def setup_postgres_cmd(
    url: str = typer.Option(..., help="postgresql://ADMIN@HOST:PORT/DB, a role that may create the schema"),
    writer: str = typer.Option(..., help="the service's role: gets SELECT and INSERT only"),
    password_env: str | None = typer.Option(
        None, help="environment variable with the administrator's password (default: PGPASSWORD)"
    ),
) -> None:
    """Create the audit schema as an administrator and grant the service's role only SELECT and INSERT,
    so that it cannot change rows or drop the triggers."""
    from .postgres import setup_schema
    from .store import is_postgres_url

    if not is_postgres_url(url):
        fail("--url: expected postgresql://USER@HOST:PORT/DB")
    for line in setup_schema(url, writer, password_env=password_env):
        typer.echo(line, err=True)
