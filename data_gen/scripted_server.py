"""A scripted OpenAI-compatible Chat Completions server over real HTTP.

A test double for paid APIs (which cannot run here), also usable for offline demos. It answers
chosen teacher outputs and injects the failures real endpoints produce: HTTP 429 with Retry-After,
500/503, timeouts, truncated output (finish_reason "length"), malformed JSON content, a malformed
or cut-off HTTP body, and a fixed per-call latency.

Script (YAML/JSON, or the `Script` model)::

    default_latency_s: 0.0
    rules:                                  # first matching rule wins
      - match: {contains: ["NCT001", "rejected by the checker"]}   # all substrings, any message
        responses: [{content: {...}}]
      - match: {contains: ["NCT001"]}
        responses:                          # n-th identical request gets responses[n] (last repeats)
          - {fault: status, status: 429, retry_after: 0.2}
          - {content: {"atoms": ...}}
    default: {auto: nulls}                  # unmatched requests; without it: HTTP 404

`auto: nulls` answers a value-miner request with every atom null, reading the atom names from the
request's structured-output schema; `auto_values: {atom: {value, evidence}}` answers those of its
atoms the request asks (a script then fits any atom chunking), with `only_quoted: true` only when
the evidence is in the text the request was sent (an atom may list several lines, e.g. one per
patient: the first whose evidence is shown is answered). `auto: excerpts` plays the chart reader:
`auto_excerpts` (recorded quotes) answer their pieces that are verbatim in the request's text, a
reader that misses nothing it is shown. `auto: sparse` answers as the sparse (v2) miner prompt
asks: only the `auto_values` of the asked atoms (with `only_quoted`, those shown), no null lines.
`ScriptedServer(count_tokens=...)` reports usage counted with that tokenizer (default: bytes / 4).
The server keeps a log of requests (hashes, not content).

Run standalone: `python -m verdict.data_gen.scripted_server --script FILE [--port 0]` prints `READY <url>`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from verdict.core import configs
from verdict.core.configs import StrictModel
from verdict.core.errors import VerdictError


class ScriptedResponse(StrictModel):
    content: str | dict | list | None = None
    auto: Literal["nulls", "sparse", "excerpts"] | None = None
    auto_values: dict[str, dict | list[dict]] = Field(
        default_factory=dict,
        description="with auto nulls: atom -> its value line ({value, evidence, bounds?}) "
        "for the atoms the request asks (the others null), so a script fits any atom chunking; "
        "a list of lines: the first whose evidence is shown (with only_quoted), else the first",
    )
    only_quoted: bool = Field(
        False,
        description="with auto_values: answer a value only when every piece of its evidence is in "
        "the text the request was sent (else null): a miner that misses nothing it is shown",
    )
    quoted_in: Literal["request", "note"] = Field(
        "request",
        description="what only_quoted and auto excerpts look in: the request's user text, or only the "
        'note (the first """-quoted block of the prompt, as the miner and reader prompts quote it): a '
        "script serving many patients then never answers a quote that only the atom list holds",
    )
    auto_excerpts: list[str] = Field(
        default_factory=list,
        description="with auto excerpts (a chart reader): these quotes' pieces (split on ' ... ') "
        "that are verbatim in the text the request was sent, as its excerpts",
    )
    fault: (
        Literal["status", "timeout", "truncated", "malformed_content", "malformed_body", "cut_body"] | None
    ) = None
    status: int = 500
    retry_after: float | None = None
    message: str | None = Field(None, description="error message of a status fault (servers echo requests)")
    finish_reason: str = "stop"
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Match(StrictModel):
    contains: list[str] = Field(default_factory=list)
    model: str | None = None


class Rule(StrictModel):
    match: Match = Field(default_factory=Match)
    responses: list[ScriptedResponse] = Field(min_length=1)


class Script(StrictModel):
    rules: list[Rule] = Field(default_factory=list)
    default: ScriptedResponse | None = None
    default_latency_s: float = 0.0
    timeout_s: float = Field(30.0, description="how long a 'timeout' fault holds the request")

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> Script:
        """A script file (YAML/JSON); ``overrides`` as ``--set key=value``. Unknown keys are errors."""
        return configs.load(cls, path, overrides, f"scripted-server script {Path(path).name}")


@dataclass
class RequestRecord:
    index: int
    key: str  # sha256 of the canonical request body
    model: str
    rule: int | None
    kind: str  # ok | <fault> | no_match
    started: float
    request_id: str | None = None  # the client's X-Verdict-Request-Id header (its cache key)
    ended: float = 0.0
    body: dict = field(default_factory=dict, repr=False)  # kept in memory for tests; never written out


class ScriptedServer:
    def __init__(
        self,
        script: Script | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | Path | None = None,
        count_tokens: Callable[[str], int] | None = None,
    ):
        self.script = script or Script()
        self.count_tokens = count_tokens
        self.requests: list[RequestRecord] = []
        self.connections = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._seen: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self._log = open(log_path, "a") if log_path else None
        handler = type("Handler", (_Handler,), {"server_ref": self})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ScriptedServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._log:
            self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def set_script(self, script: Script) -> None:
        with self._lock:
            self.script = script
            self._seen.clear()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._seen.clear()
            self.connections = 0
            self.peak_in_flight = 0

    def keys(self) -> list[str]:
        return [r.key for r in self.requests]

    # -- choosing the answer -----------------------------------------------------------------------
    def _choose(self, body: dict) -> tuple[int | None, ScriptedResponse | None, str]:
        key = canonical_hash(body)
        text = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        with self._lock:
            script = self.script
            for i, rule in enumerate(script.rules):
                m = rule.match
                if m.model and m.model != body.get("model"):
                    continue
                if all(s in text for s in m.contains):
                    n = self._seen.get((i, key), 0)
                    self._seen[(i, key)] = n + 1
                    return i, rule.responses[min(n, len(rule.responses) - 1)], key
        return None, script.default, key

    def _log_line(self, rec: RequestRecord) -> None:
        with self._lock:
            if self._log:
                self._log.write(
                    json.dumps(
                        {
                            "i": rec.index,
                            "key": rec.key,
                            "id": rec.request_id,
                            "model": rec.model,
                            "rule": rec.rule,
                            "kind": rec.kind,
                            "t": round(rec.started, 4),
                            "dt": round(rec.ended - rec.started, 4),
                        }
                    )
                    + "\n"
                )
                self._log.flush()


def canonical_hash(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def auto_nulls(body: dict) -> dict:
    """Every atom null, atom names taken from the request's structured-output schema."""
    schema = (
        (body.get("response_format") or {}).get("json_schema", {}).get("schema")
        or (body.get("structured_outputs") or {}).get("json")
        or {}
    )
    names = _find_atom_enum(schema) or []
    return {"values": [{"atom": a, "value": None, "evidence": ""} for a in names]}


def request_text(body: dict) -> str:
    """The text a request was sent (its user messages), whitespace-normalized."""
    from verdict.data_gen.formalizer import normalize_ws

    return normalize_ws(
        " ".join(str(m.get("content", "")) for m in body.get("messages", []) if m.get("role") == "user")
    )


def note_text(body: dict) -> str:
    """The note a request quotes (the first \"\"\"-delimited block of its user text), whitespace-normalized;
    the whole user text if it quotes none."""
    from verdict.data_gen.formalizer import normalize_ws

    for m in body.get("messages", []):
        parts = str(m.get("content", "")).split('"""') if m.get("role") == "user" else []
        if len(parts) >= 3:
            return normalize_ws(parts[1])
    return request_text(body)


def _shown(evidence: str, shown: str) -> bool:
    from verdict.data_gen.formalizer import split_pieces

    pieces = split_pieces(evidence)
    return bool(pieces) and all(p in shown for p in pieces)


def auto_excerpts(body: dict, quotes: list[str], quoted_in: str = "request") -> list[str]:
    """The pieces of `quotes` verbatim in the request's text (or its note), each once, in the order given."""
    from verdict.data_gen.formalizer import split_pieces

    shown = note_text(body) if quoted_in == "note" else request_text(body)
    return list(dict.fromkeys(p for q in quotes for p in split_pieces(q) if p in shown))


def _find_atom_enum(node: Any) -> list[str] | None:
    if isinstance(node, dict):
        atom = node.get("properties", {}).get("atom") if isinstance(node.get("properties"), dict) else None
        if isinstance(atom, dict) and isinstance(atom.get("enum"), list):
            return atom["enum"]
        for v in node.values():
            found = _find_atom_enum(v)
            if found:
                return found
    elif isinstance(node, list):
        for v in node:
            found = _find_atom_enum(v)
            if found:
                return found
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_ref: ScriptedServer

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every response (real API servers set it too).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server_ref._lock:
            self.server_ref.connections += 1

    def log_message(self, *args):  # quiet: the server keeps its own log of hashes
        pass

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        srv = self.server_ref
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.split("?")[0].endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "request body is not JSON"}})
            return
        rule, resp, key = srv._choose(body)
        # Recorded before the answer goes out: a client that has its response can rely on the log.
        with srv._lock:
            rec = RequestRecord(
                index=len(srv.requests),
                key=key,
                model=str(body.get("model")),
                rule=rule,
                kind="no_match" if resp is None else (resp.fault or "ok"),
                started=time.time(),
                body=body,
                request_id=self.headers.get("X-Verdict-Request-Id"),
            )
            srv.requests.append(rec)
            srv.in_flight += 1
            srv.peak_in_flight = max(srv.peak_in_flight, srv.in_flight)
        try:
            self._answer(srv, body, resp)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout): that is the point of the fault
        finally:
            rec.ended = time.time()
            with srv._lock:
                srv.in_flight -= 1
            srv._log_line(rec)

    def _answer(self, srv: ScriptedServer, body: dict, resp: ScriptedResponse | None) -> None:
        script = srv.script
        if resp is None:
            self._json(404, {"error": {"message": "scripted server: no rule matches this request"}})
            return
        latency = resp.latency_s if resp.latency_s is not None else script.default_latency_s
        if resp.fault == "timeout":
            latency = max(latency, script.timeout_s)
        if latency:
            time.sleep(latency)
        if resp.fault == "status":
            headers = {"Retry-After": f"{resp.retry_after:g}"} if resp.retry_after is not None else {}
            msg = resp.message or ("rate limited" if resp.status == 429 else "scripted failure")
            self._json(
                resp.status, {"error": {"message": msg, "type": "scripted", "code": resp.status}}, headers
            )
            return
        if resp.fault == "malformed_body":
            data = b'{"id": "chatcmpl-scripted", "choices": [{"index": 0, "message": {"role": "assista'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if resp.auto in ("nulls", "sparse"):
            values = auto_nulls(body)["values"]
            shown = note_text(body) if resp.quoted_in == "note" else request_text(body)
            said = {}
            for a, lines in resp.auto_values.items():
                for line in lines if isinstance(lines, list) else [lines]:
                    if not resp.only_quoted or _shown(line.get("evidence", ""), shown):
                        said[a] = line
                        break
            if resp.auto == "sparse":  # only the established atoms, no null lines
                values = [v for v in values if v["atom"] in said]
            content = json.dumps({"values": [{"atom": v["atom"], **said.get(v["atom"], v)} for v in values]})
        elif resp.auto == "excerpts":
            content = json.dumps({"excerpts": auto_excerpts(body, resp.auto_excerpts, resp.quoted_in)})
        elif isinstance(resp.content, (dict, list)):
            content = json.dumps(resp.content)
        else:
            content = resp.content or ""
        finish = resp.finish_reason
        if resp.fault == "truncated":
            content, finish = content[: max(1, len(content) // 2)], "length"
        elif resp.fault == "malformed_content":
            content = content[: max(1, len(content) // 2)] + ' ,,"oops'
        prompt_text = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        count = srv.count_tokens or (lambda text: len(text.encode()) // 4 + 1)
        payload = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
            ],
            "usage": {
                "prompt_tokens": resp.prompt_tokens if resp.prompt_tokens is not None else count(prompt_text),
                "completion_tokens": resp.completion_tokens
                if resp.completion_tokens is not None
                else count(content),
            },
        }
        payload["usage"]["total_tokens"] = (
            payload["usage"]["prompt_tokens"] + payload["usage"]["completion_tokens"]
        )
        if resp.fault == "cut_body":
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) + 100))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self._json(200, payload)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", help="YAML/JSON script; default: answer every request with auto nulls")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=None, help="fixed per-call latency in seconds")
    ap.add_argument("--log", help="append a JSON line per request (hashes only) to this file")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a script key, e.g. --set default_latency_s=0.5 (repeatable)",
    )
    a = ap.parse_args(argv)
    try:
        if a.script:
            script = Script.load(a.script, a.overrides)
        else:
            script = configs.build(
                Script, {"default": {"auto": "nulls"}}, a.overrides, "scripted-server script"
            )
    except VerdictError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    if a.latency is not None:
        script.default_latency_s = a.latency
    srv = ScriptedServer(script, host=a.host, port=a.port, log_path=a.log)
    print(f"READY {srv.url}", flush=True)
    try:
        srv._httpd.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        srv._httpd.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
