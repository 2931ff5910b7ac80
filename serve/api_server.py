"""Run the matching API under uvicorn, with logging set up so that no request content is logged.

Libraries that log request bodies at DEBUG (the openai client logs whole requests, prompts with
patient notes included) are pinned to WARNING whatever the service's level, and uvicorn's own
access log (raw paths and query strings) is replaced by `middleware.AccessLog`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from verdict.train.run_dir import write_atomic

from .api_config import ApiConfig
from .api_keys import KeyStore
from .app import create_app

# Loggers that must never go below WARNING: they log request bodies or full URLs at INFO/DEBUG.
QUIET = ("openai", "openai._base_client", "httpx", "httpcore", "uvicorn.access", "urllib3")


def setup_logging(log_file: str | None, level: str = "INFO") -> logging.Handler:
    handler: logging.Handler
    private_error: OSError | None = None
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        # The log names patient ids: private (0600) before the first line, and an older file too.
        os.close(os.open(log_file, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
        try:
            os.chmod(log_file, 0o600)
        except OSError as e:  # another user's file: say so once the handler is set up
            private_error = e
        handler = logging.FileHandler(log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("verdict.serve", "verdict.data_gen", "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers = [handler]
        lg.setLevel(level)
        lg.propagate = False
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.pop("OPENAI_LOG", None)  # the openai client's own switch for debug logging
    if private_error is not None:
        logging.getLogger("verdict.serve").warning(
            "cannot make the log file private (0600): %s", type(private_error).__name__
        )
    return handler


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before starting uvicorn, so port 0 gives a free port we know before serving. The
    protocol is named: asyncio sets TCP_NODELAY only on sockets whose `proto` is IPPROTO_TCP, and
    without it Nagle's algorithm adds ~40 ms to a response on a reused connection."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def is_loopback(host: str) -> bool:

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run_api(config: ApiConfig, base_url: str, *, ready_file: str | None = None, on_ready=None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM). ``ready_file`` gets {"url": ...} once listening."""

    import uvicorn  # heavy optional dependency: uvicorn (serve extra)

    setup_logging(config.log_file)
    app = create_app(config, base_url)
    if KeyStore(config.api_keys).count() == 0:
        logging.getLogger("verdict.serve").warning(
            "no API keys in %s: every route but /healthz and /readyz will answer 401 "
            "(create one with `verdict serve keys add --role match ...`)",
            config.api_keys,
        )
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal that stopped it once it has shut down; with the default SIGTERM
        # handler that would kill this process before its caller's cleanup (stopping vLLM in `up`).
        signal.signal(signal.SIGTERM, lambda *_: None)
    if not is_loopback(config.host) and not config.tls.enabled:
        logging.getLogger("verdict.serve").warning(
            "bound to %s without TLS: API keys and patient notes cross the network in clear text; "
            "terminate TLS at the site's reverse proxy (and bind to 127.0.0.1), or set api.tls.certfile "
            "and api.tls.keyfile",
            config.host,
        )
    sock = bind_socket(config.host, config.port)
    host = f"[{config.host}]" if ":" in config.host else config.host
    scheme = "https" if config.tls.enabled else "http"
    url = f"{scheme}://{host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            access_log=False,
            log_config=None,
            timeout_graceful_shutdown=10,
            lifespan="on",
            server_header=False,  # no `Server: uvicorn` banner
            ssl_certfile=config.tls.certfile,
            ssl_keyfile=config.tls.keyfile,
        )
    )

    async def serve():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            logging.getLogger("verdict.serve").info(
                "matching API listening on %s (formalizer %s)", url, base_url
            )
            if ready_file:  # written whole: whoever waits for the file never reads it half-written
                write_atomic(
                    Path(ready_file), json.dumps({"url": url, "formalizer": base_url, "pid": os.getpid()})
                )
            if on_ready:
                on_ready(url)
        await task

    asyncio.run(serve())
