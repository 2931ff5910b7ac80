"""`verdict serve ...` commands. Keep module-level imports light: heavy stacks load inside commands.

verdict serve vllm --config NAME          start the student server, wait until ready, serve
verdict serve api --config NAME           the matching API in front of it
verdict serve up --config NAME            both, in one process (stops vLLM on exit)
verdict serve sizing --config NAME        the GPU memory a config needs (gpu_sizing's formula)
verdict serve systemd --config NAME       systemd units for vLLM and the API at a site's prefix
verdict serve slurm-job --config NAME     serve.sbatch for a serve config (inputs checked first)
verdict serve stop --state-file FILE      stop a server started with --detach
verdict serve keys add|list|revoke        API keys (stored hashed)
verdict serve audit verify|backup|restore|setup-postgres   the audit store
verdict serve check-adapter --config ...  vLLM vs PEFT on a golden set
verdict serve openapi                     print the API's OpenAPI schema

Imports inside the commands: a part's cli module imports only typer (and light modules) at module
level, so that `verdict --help` and the other parts' commands never load this part's heavy optional
dependencies (fastapi, vLLM, httpx, psycopg, jinja2: the serve and slurm extras; verdict/cli.py).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import typer
from verdict.core.cli_errors import fail

from .api_keys import ROLES
from .audit.cli import audit_app
from .reviews.cli import export_reviews_command

app = typer.Typer(help="serve commands", no_args_is_help=True)
keys_app = typer.Typer(help="API keys of the matching service (stored hashed)", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")
app.command("export-reviews")(export_reviews_command)

CONFIG_HELP = "serve config: NAME in configs/serve/ or a YAML path"
SET_HELP = "override a config value, e.g. --set vllm.port=8011 (repeatable)"
INIT_HELP = "create the audit store and the key file if they do not exist (a first start)"


def _config(config: str, sets: list[str] | None):
    from .config import load_serve_config

    return load_serve_config(config, sets or [])


class _Stop:
    """SIGINT/SIGTERM -> a flag (the default handlers would skip our cleanup)."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, *_):
        self.requested = True


@app.command("vllm")
def vllm_cmd(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    detach: bool = typer.Option(False, help="return once ready, leaving the server running"),
    state_file: Path | None = typer.Option(None, help="with --detach: where to write pid and URL"),
    print_command: bool = typer.Option(False, help="print the vLLM command line and exit"),
) -> None:
    """Start vLLM's OpenAI-compatible server with the base model and the adapters; wait until ready."""
    from .vllm.server import VLLMServer

    cfg = _config(config, set_).require("vllm")
    server = VLLMServer(cfg)
    if print_command:
        import shlex

        typer.echo(shlex.join(server.command()))
        return
    if detach and state_file is None:
        fail("--detach needs --state-file (how `verdict serve stop` finds the server)")
    stop = _Stop()
    typer.echo(
        f"starting vLLM ({cfg.device}) with {', '.join(cfg.model_names())}; log: {server.log_path}",
        err=True,
    )
    t0 = time.monotonic()
    server.start(wait=False, detached=detach)  # without --detach it dies with this command
    try:
        server.wait_ready(progress=lambda m: typer.echo(m, err=True))
    except BaseException:
        server.stop()
        raise
    typer.echo(f"vLLM ready after {time.monotonic() - t0:.0f} s at {server.base_url}", err=True)
    typer.echo(json.dumps(server.state().model_dump()))
    if detach:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(server.state().model_dump_json(indent=2))
        return
    try:
        while not stop.requested and server.running:
            time.sleep(0.5)
        if not stop.requested:
            from .vllm.server import log_tail

            fail(f"vLLM exited unexpectedly; last lines of {server.log_path}:\n{log_tail(server.log_path)}")
    finally:
        server.stop()
    typer.echo("vLLM stopped", err=True)


@app.command("stop")
def stop_cmd(
    state_file: Path = typer.Option(..., help="state file written by `serve vllm --detach`"),
) -> None:
    """Stop a vLLM server started with --detach."""
    from .vllm.server import ServerState, stop_process_group

    try:
        state = ServerState.model_validate_json(state_file.read_text())
    except (OSError, ValueError) as e:
        fail(f"cannot read state file {state_file}: {e}")
    stop_process_group(state.pid)
    if state.tmp_dir:
        import shutil

        shutil.rmtree(state.tmp_dir, ignore_errors=True)
    state_file.unlink(missing_ok=True)
    typer.echo(f"stopped vLLM (pid {state.pid})", err=True)


def _formalizer_url(cfg, override: str | None, vllm_url: str | None = None) -> list[str]:
    """The formalizer servers: --formalizer-url, else api.formalizer.base_urls / base_url, else the
    server `serve up` started, else the `vllm` section's fixed port."""
    if override:
        return [override]
    api = cfg.require("api")
    if api.formalizer.configured_urls:
        return api.formalizer.configured_urls
    if vllm_url:
        return [vllm_url]
    v = cfg.require("vllm")
    if not v.port:
        fail(
            "api.formalizer.base_url is unset and vllm.port is 0 (chosen at start): use `verdict serve up`, "
            "or pass --formalizer-url"
        )
    return [f"http://{v.host}:{v.port}/v1"]


@app.command("api")
def api_cmd(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    formalizer_url: str | None = typer.Option(None, help="OpenAI-compatible base URL of the students"),
    ready_file: Path | None = typer.Option(None, help='write {"url": ...} here once listening'),
    init: bool = typer.Option(False, "--init", help=INIT_HELP),
) -> None:
    """Run the matching API (FastAPI) in front of a running student server."""
    from .api_server import run_api

    cfg = _config(config, set_)
    _check_api(cfg, init)
    run_api(
        cfg.require("api"),
        _formalizer_url(cfg, formalizer_url),
        ready_file=str(ready_file) if ready_file else None,
    )


def _check_api(cfg, init: bool) -> None:
    """The API side before anything slow: its address free, its files there (or --init); then say
    which files it uses, by absolute path."""
    from .preflight import check_address
    from .startup import check_api_files, files_used

    api = cfg.require("api")
    check_address(api.host, api.port)
    check_api_files(api, init)
    for what, where in files_used(api, cfg.source):
        typer.echo(f"{what}: {where}", err=True)


@app.command("up")
def up_cmd(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    ready_file: Path | None = typer.Option(None, help='write {"url": ..., "formalizer": ...} once serving'),
    init: bool = typer.Option(False, "--init", help=INIT_HELP),
) -> None:
    """Start vLLM with the students, then the matching API in front of it; Ctrl-C stops both.

    vLLM is supervised: if it dies (even by SIGKILL) the rest of its process group and its temporary
    files are removed, stderr and the log say so, /readyz says why, and the API answers 503 until a
    formalizer is back (api.formalizer.base_urls may name further servers to fail over to)."""
    import logging

    from .api_server import run_api
    from .vllm.server import VLLMServer

    cfg = _config(config, set_)
    api = cfg.require("api")
    _check_api(cfg, init)  # minutes before vLLM would have loaded the model
    server = VLLMServer(cfg.require("vllm"))
    server.check_paths()
    typer.echo(f"starting vLLM with {', '.join(cfg.vllm.model_names())}; log: {server.log_path}", err=True)
    t0 = time.monotonic()
    server.start(wait=False)
    try:
        server.wait_ready(progress=lambda m: typer.echo(m, err=True))
        typer.echo(f"vLLM ready after {time.monotonic() - t0:.0f} s at {server.base_url}", err=True)
        typer.echo(json.dumps(server.state().model_dump()))

        def vllm_died(message: str) -> None:
            typer.echo(f"error: {message}", err=True)
            logging.getLogger("verdict.serve").error("%s", message.split("\n", 1)[0])

        server.supervise(vllm_died)
        urls = _formalizer_url(cfg, None, server.base_url)
        if server.base_url not in urls:
            urls = [server.base_url, *urls]
        run_api(
            api,
            urls,
            ready_file=str(ready_file) if ready_file else None,
            on_ready=lambda url: typer.echo(f"matching API at {url} ({_api_reference(api, url)})", err=True),
        )
    finally:
        server.stop()
        typer.echo("vLLM stopped", err=True)


def _api_reference(api, url: str) -> str:
    """Where the API is described: the schema it serves (api.docs, any valid key), else the command."""
    if api.docs:
        return f"schema: {url}/openapi.json, with a key"
    return "its schema: `verdict serve openapi`"


@app.command("sizing")
def sizing_cmd(
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    table: bool = typer.Option(False, help="print docs/serve.md's table (Qwen2.5-7B, bf16, two adapters)"),
) -> None:
    """GPU memory a config needs: weights + adapters + KV cache per token x tokens
    (serve/vllm/gpu_sizing.py)."""
    from .preflight import memory_needed
    from .vllm.gpu_sizing import sizing_table

    if table:
        typer.echo(sizing_table([1, 8, 16, 32, 64, 128, 256]))
        return
    if config is None:
        fail("give --config NAME, or --table")
    need = memory_needed(_config(config, set_).require("vllm"))
    if need is None:
        fail("cannot size it: the base model folder or an adapter is not readable (see `verdict serve up`)")
    typer.echo(need.text())


@app.command("slurm-job")
def slurm_job_cmd(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    slurm: str = typer.Option("default", "--slurm", "-s", help="cluster config (configs/slurm)"),
    set_slurm: list[str] | None = typer.Option(None, "--set-slurm", help="override a cluster config key"),
    name: str = typer.Option("students", help="job name suffix (verdict-serve-NAME)"),
    listen: str = typer.Option(
        "node", help="node: vLLM on the compute node's name (the API elsewhere); loopback"
    ),
    out: Path = typer.Option(Path("slurm-jobs"), help="folder for serve.sbatch"),
) -> None:
    """Render serve.sbatch for a serve config, after checking its base model and adapters."""
    from verdict.core.configs import find_config
    from verdict.slurm.job_config import load_slurm_config

    from .vllm.slurm_job import render_serve_job

    if listen not in ("node", "loopback"):
        fail("--listen must be 'node' or 'loopback'")
    slurm_cfg = load_slurm_config(find_config("slurm", slurm), set_slurm or [])
    script, reach = render_serve_job(config, slurm_cfg, out, name, set_ or [], listen)  # type: ignore[arg-type]
    typer.echo(reach, err=True)
    typer.echo(str(script))


@app.command("systemd")
def systemd_cmd(
    config: str = typer.Option(..., "--config", "-c", help="serve config name (in --config-dir) or file"),
    prefix: Path = typer.Option(..., help="install prefix: the virtual environment with bin/verdict"),
    state_dir: Path = typer.Option(..., help="the serve config's root: audit store, keys, logs"),
    vllm_python: Path | None = typer.Option(None, help="interpreter of the vLLM environment"),
    hashes: Path | None = typer.Option(
        None, help="sha256sum list of the weights and adapters: checked before vLLM starts"
    ),
    user: str = typer.Option("verdict", help="the unprivileged user the services run as"),
    group: str = typer.Option("verdict"),
    out: Path = typer.Option(Path("."), help="folder for the unit files (then copy to /etc/systemd/system)"),
) -> None:
    """Render verdict-vllm.service and verdict-api.service for a site's install prefix."""
    import os

    from .systemd import UnitSettings, write_units

    try:
        settings = UnitSettings(
            config=config,
            prefix=str(prefix),
            state_dir=str(state_dir),
            config_dir=os.environ.get("VERDICT_CONFIG_DIR"),
            vllm_python=str(vllm_python) if vllm_python else None,
            hashes=str(hashes) if hashes else None,
            user=user,
            group=group,
        )
    except ValueError as e:
        fail(str(e).split("\n", 1)[-1].strip())
    for path in write_units(settings, out):
        typer.echo(str(path))


# ---- keys -------------------------------------------------------------------------------------------
def _key_store(keys_file: Path | None, config: str | None):
    from .api_keys import KeyStore

    if keys_file is None and config is None:
        fail("give --keys-file or --config (its api.api_keys)")
    if keys_file is None:
        keys_file = Path(_config(config, None).require("api").api_keys)
    return KeyStore(keys_file)


@keys_app.command("add")
def keys_add(
    name: str = typer.Option(..., help="who or what uses the key, e.g. 'ehr-integration'"),
    role: list[str] = typer.Option(..., "--role", help=f"{' | '.join(ROLES)} (repeatable)"),
    keys_file: Path | None = typer.Option(None, help="key file (default: the config's api.api_keys)"),
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    expires_days: float | None = typer.Option(None, help="refuse the key this many days from now"),
) -> None:
    """Create a key. It is printed once (stdout) and stored only as a hash."""
    store = _key_store(keys_file, config)
    key, entry = store.add(name, role, expires_days=expires_days)
    typer.echo(
        f"key id {entry.id} ({entry.name}, roles {', '.join(entry.roles)}) added to {store.path}", err=True
    )
    typer.echo(key)


@keys_app.command("list")
def keys_list(
    keys_file: Path | None = typer.Option(None),
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
) -> None:
    """List key ids, state, roles, expiry (UTC; `never`) and names (never the keys)."""
    from datetime import UTC, datetime

    for k in _key_store(keys_file, config).load().keys:
        state = "revoked" if k.revoked else "expired" if k.expired() else "active"
        expires = (
            datetime.fromtimestamp(k.expires_at, UTC).strftime("%Y-%m-%dT%H:%MZ") if k.expires_at else "never"
        )
        typer.echo(f"{k.id}\t{state}\t{','.join(k.roles)}\texpires {expires}\t{k.name}")


@keys_app.command("revoke")
def keys_revoke(
    key_id: str = typer.Argument(..., help="the key id (second part of vk_<id>_...)"),
    keys_file: Path | None = typer.Option(None),
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
) -> None:
    """Revoke a key (takes effect at once, also in a running service)."""
    entry = _key_store(keys_file, config).revoke(key_id)
    typer.echo(f"revoked {entry.id} ({entry.name})", err=True)


# ---- checks and schema ------------------------------------------------------------------------------
@app.command("check-adapter")
def check_adapter_cmd(
    config: str = typer.Option(..., "--config", "-c", help=CONFIG_HELP),
    golden: Path = typer.Option(
        ..., help="golden set: JSONL of chat records ({messages: [...]}, SFT layout)"
    ),
    adapter: list[str] | None = typer.Option(None, help="adapter name(s) to check (default: all)"),
    set_: list[str] | None = typer.Option(None, "--set", help=SET_HELP),
    base_url: str | None = typer.Option(None, help="a running vLLM server (default: start one)"),
    limit: int | None = typer.Option(None, help="first N records only"),
    max_tokens: int = typer.Option(512, help="tokens generated per record"),
    min_agreement: float = typer.Option(1.0, help="exit 1 if an adapter agrees on fewer records than this"),
    report: Path | None = typer.Option(None, help="write the full report (JSON) here"),
) -> None:
    """Run a golden set through vLLM and through PEFT/transformers (greedy) and report agreement, so
    an adapter that vLLM serves differently is caught before deployment."""
    from .vllm.adapter_check import AdapterCheckConfig, run_adapter_check

    cfg = _config(config, set_).require("vllm")
    check = AdapterCheckConfig(
        golden=str(golden),
        adapters=adapter or None,
        limit=limit,
        max_tokens=max_tokens,
        min_agreement=min_agreement,
        base_url=base_url,
    )
    result = run_adapter_check(cfg, check, progress=lambda m: typer.echo(m, err=True))
    for a in result.adapters:
        flag = "ok" if a.agreement >= min_agreement else "DISAGREES"
        typer.echo(
            f"{a.adapter}: {a.agree}/{a.total} records identical ({a.agreement:.1%}), "
            f"{a.json_equal}/{a.total} same JSON, {a.teacher_match}/{a.total} match the reference  [{flag}]"
        )
        for r in a.records:
            if not r.agree:
                typer.echo(f"  {r.record_id}: first difference at character {r.first_difference}")
    if report:
        report.write_text(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.passed else 1)


@app.command("openapi")
def openapi_cmd(out: Path | None = typer.Option(None, help="write here instead of stdout")) -> None:
    """Print the matching API's OpenAPI schema (no server, no model needed)."""
    import tempfile

    from .api_config import ApiConfig
    from .app import create_app

    with tempfile.TemporaryDirectory() as d:
        cfg = ApiConfig(audit_db=str(Path(d) / "audit.sqlite"), api_keys=str(Path(d) / "keys.json"))
        text = json.dumps(create_app(cfg, "http://127.0.0.1:1/v1").openapi(), indent=2)
    if out:
        out.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
