"""The HTTP edge of the service, as plain ASGI middleware:

`BodyLimit`   refuses bodies over the configured size with 413 before the app sees a byte.
`AccessLog`   one log line and the Prometheus counters per request (route *template*, status,
              latency, caller key id: never a path with data in it, never a body), and the last
              guard: an unexpected exception becomes a 500 naming an incident id, and is logged as
              its type and code location only, since exception messages can carry request content.
              A cancellation that is not this request's own (shared work cancelled by another
              request) is such an exception too; the request's own cancellation (client gone,
              shutdown) is never swallowed.
`SecurityHeaders`  the same security headers on every response, and no `Server` banner.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
import uuid

from .metrics import ServiceMetrics

log = logging.getLogger("verdict.serve.access")
errlog = logging.getLogger("verdict.serve")


# Every response: no framing, no referrer, no MIME sniffing, never cached (responses carry patient
# data), and a policy that loads nothing (the clinician page sets its own, which allows its style).
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                have = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in have]
                message = {**message, "headers": headers}
            await send(message)

        return await self.app(scope, receive, sending)


async def send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = {
            "error": "payload_too_large",
            "message": f"request body over {self.max_bytes} bytes",
            "problems": [{"field": "body", "message": f"at most {self.max_bytes} bytes"}],
        }
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > self.max_bytes:
                    return await send_json(send, 413, too_large)
            except ValueError:
                return await send_json(
                    send, 400, {"error": "bad_request", "message": "invalid Content-Length", "problems": []}
                )
        # Read (at most the limit of) the body first, then replay it: a chunked upload without a
        # length is counted too.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await send_json(send, 413, too_large)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class AccessLog:
    def __init__(self, app, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = {"code": 500, "started": False}

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["started"] = True
            await send(message)

        try:
            try:
                await self.app(scope, receive, sending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():  # this request itself is cancelled: let it end
                    raise
                raise _ForeignCancellation() from None  # someone else's cancellation reached us
        except Exception as e:  # noqa: BLE001 - the last guard: log safely, answer 500, never re-raise
            incident = uuid.uuid4().hex[:12]
            frames = traceback.extract_tb(e.__traceback__)[-6:]
            where = " <- ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in reversed(frames)
            )
            errlog.error("internal error incident=%s type=%s at %s", incident, type(e).__name__, where)
            self.metrics.errors.labels("internal_error").inc()
            status["code"] = 500
            if not status["started"]:
                await send_json(
                    send,
                    500,
                    {
                        "error": "internal_error",
                        "problems": [],
                        "message": f"internal error (incident {incident}); see the service log",
                    },
                )
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            dt = time.perf_counter() - t0
            method = scope.get("method", "")
            self.metrics.requests.labels(template, method, str(status["code"])).inc()
            self.metrics.request_seconds.labels(template).observe(dt)
            key_id = (scope.get("state") or {}).get("key_id", "-")
            log.info("%s %s %d %.1fms key=%s", method, template, status["code"], dt * 1000, key_id)


class _ForeignCancellation(Exception):
    """A CancelledError that did not cancel this request (shared work cancelled elsewhere)."""
