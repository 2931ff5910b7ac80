"""Async client for one OpenAI-compatible Chat Completions endpoint (the official `openai` client).

What it adds: the egress check before anything is sent, bounded concurrency, retries with
exponential backoff and jitter on 429/5xx/timeouts/broken responses (honouring Retry-After),
structured outputs in the endpoint's dialect, and error messages that never quote patient text.
The openai client's own retries are off so that every attempt is counted and paced here.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import importlib
import inspect
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from .egress import EgressPolicy
from .endpoint_config import EndpointConfig
from .errors import ConfigError, EndpointError

log = logging.getLogger("verdict.data_gen.formalizer.client")
RETRY_AFTER_MAX_S = 300.0
REQUEST_ID_HEADER = "X-Verdict-Request-Id"


@dataclass(frozen=True)
class Completion:
    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    usage_estimated: bool
    attempts: int
    latency_s: float


def build_request(
    teacher: EndpointConfig, stage: str, messages: list[dict[str, str]], schema: dict | None, schema_name: str
) -> dict[str, Any]:
    """The exact Chat Completions request (keyword arguments of `chat.completions.create`)."""
    params: dict[str, Any] = {"model": teacher.model, "messages": messages}
    params[teacher.max_tokens_param] = teacher.max_tokens.for_stage(stage)
    if teacher.temperature is not None:
        params["temperature"] = teacher.temperature
    if teacher.seed is not None:
        params["seed"] = teacher.seed
    extra_body = dict(teacher.extra_body)
    known = _create_params()
    for k, v in teacher.extra_params.items():
        (params if k in known else extra_body)[k] = v
    if schema is not None:
        if teacher.structured_output == "json_schema":
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": teacher.strict_schema},
            }
        elif teacher.structured_output == "vllm":
            # Current vLLM reads `structured_outputs`; the old `guided_json` is silently ignored.
            extra_body["structured_outputs"] = {"json": schema}
        elif teacher.structured_output == "json_object":
            params["response_format"] = {"type": "json_object"}
    if extra_body:
        params["extra_body"] = extra_body
    return params


@functools.lru_cache(maxsize=1)
def _create_params() -> frozenset[str]:
    from openai.resources.chat.completions import AsyncCompletions

    return frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self", "extra_body"}


class EndpointClient:
    def __init__(
        self, teacher: EndpointConfig, *, egress: EgressPolicy | None = None, seed: int | None = None
    ):
        self.teacher = teacher
        self.egress = egress if egress is not None else EgressPolicy.from_config()
        self._rng = random.Random(seed)
        self._client = None
        self._sem: asyncio.Semaphore | None = None
        self.requests_sent = 0  # HTTP attempts, including retries

    # -- plumbing --------------------------------------------------------------------------------
    def _openai(self):
        if self._client is not None:
            return self._client
        import openai

        t = self.teacher
        key = "EMPTY"
        if t.api_key_env:
            key = os.environ.get(t.api_key_env, "")
            if not key:
                raise ConfigError(
                    f"teacher '{t.name}': environment variable {t.api_key_env} is not set "
                    "(it holds the API key)"
                )
        http = _http_module()
        http_client = openai.DefaultAsyncHttpxClient(
            trust_env=False,  # no proxies or certificates from the environment: egress is decided here
            follow_redirects=False,  # a redirect could carry the request body to another host
            proxy=t.proxy,
            limits=http.Limits(max_connections=t.concurrency, max_keepalive_connections=t.concurrency),
        )
        common = dict(api_key=key, max_retries=0, timeout=t.timeout_s, http_client=http_client)
        if t.api == "azure":
            self._client = openai.AsyncAzureOpenAI(
                azure_endpoint=t.base_url, api_version=t.api_version, **common
            )
        else:
            self._client = openai.AsyncOpenAI(base_url=t.base_url, **common)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.teacher.concurrency)
        return self._sem

    def check_egress(self, *, carries_patient_text: bool, data_class: str, what: str) -> None:
        self.egress.check(
            self.teacher.base_url,
            carries_patient_text=carries_patient_text,
            data_class=data_class,
            what=what,
            via_proxy=self.teacher.proxy,
        )

    # -- the call --------------------------------------------------------------------------------
    async def complete(
        self,
        request: dict[str, Any],
        *,
        carries_patient_text: bool,
        data_class: str = "private",
        what: str = "request",
        sensitive: tuple[str, ...] = (),
        request_id: str | None = None,
    ) -> Completion:
        """Send one request (retrying transient failures) and return the first answer.

        ``request_id`` (the cache key, a hash) goes out as the X-Verdict-Request-Id header so that
        gateway logs can be matched with the cache; it says nothing about the content."""
        t = self.teacher
        self.check_egress(carries_patient_text=carries_patient_text, data_class=data_class, what=what)
        import openai

        client = self._openai()
        attempt = 0
        start = time.monotonic()
        while True:
            attempt += 1
            retry_after = None
            try:
                async with self._semaphore():
                    self.requests_sent += 1
                    resp = await client.chat.completions.create(
                        **request, extra_headers={REQUEST_ID_HEADER: request_id} if request_id else None
                    )
                return _completion(resp, request, attempt, time.monotonic() - start)
            except openai.APIStatusError as e:
                status = e.status_code
                retryable = status in (408, 409, 429) or status >= 500
                private = carries_patient_text and data_class not in ("public", "synthetic")
                # A server's message can echo any fragment of a private note, too short to recognize.
                problem = f"HTTP {status}: " + (
                    PRIVATE_WITHHELD if private else _server_message(e, sensitive)
                )
                retry_after = _retry_after(e.response.headers) if e.response is not None else None
            except openai.APITimeoutError:
                status, retryable, problem = None, True, f"no answer within {t.timeout_s:g} s"
            except openai.APIConnectionError as e:
                status, retryable, problem = (
                    None,
                    True,
                    f"connection failed ({type(e.__cause__ or e).__name__})",
                )
            except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as e:
                status, retryable, problem = None, True, f"malformed response body ({type(e).__name__})"
            if not retryable or attempt > t.max_retries:
                tries = f"after {attempt} attempt{'s' if attempt > 1 else ''}"
                raise EndpointError(
                    f"teacher '{t.name}' ({t.host}) failed {tries}: {problem}",
                    status=status,
                    retryable=retryable,
                )
            delay = self._delay(attempt, retry_after)
            log.info("retry teacher=%s attempt=%d in %.2fs: %s", t.name, attempt, delay, problem)
            await asyncio.sleep(delay)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        t = self.teacher
        if retry_after is not None:  # the server said when; a little jitter spreads the herd
            return min(retry_after, RETRY_AFTER_MAX_S) * (1 + 0.1 * self._rng.random())
        cap = min(t.backoff_max_s, t.backoff_base_s * 2 ** (attempt - 1))
        return cap / 2 + self._rng.uniform(0, cap / 2)  # "equal jitter": never near zero, never synchronized


def _http_module():
    """The HTTP library the installed openai client is built on (httpx or its successor)."""
    import openai

    base = next(c for c in openai.DefaultAsyncHttpxClient.__mro__ if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.split(".")[0])


def _completion(resp, request: dict, attempts: int, latency: float) -> Completion:
    choice = resp.choices[0] if getattr(resp, "choices", None) else None
    content = choice.message.content if choice is not None and choice.message is not None else None
    finish = choice.finish_reason if choice is not None else None
    usage = getattr(resp, "usage", None)
    if usage is not None and usage.prompt_tokens is not None:
        return Completion(
            content,
            finish,
            int(usage.prompt_tokens),
            int(usage.completion_tokens or 0),
            False,
            attempts,
            latency,
        )
    from .ledger import (
        estimate_prompt_tokens,  # no usage reported: estimate so the ledger stays conservative
    )

    out = len((content or "").encode()) // 3 + 1
    return Completion(
        content, finish, estimate_prompt_tokens(request["messages"]), out, True, attempts, latency
    )


def _retry_after(headers) -> float | None:
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(ra)
            return max(0.0, when.timestamp() - time.time())
        except (TypeError, ValueError):
            return None


PRIVATE_WITHHELD = "[server message withheld: the request carries private patient text]"


def _server_message(e, sensitive: tuple[str, ...]) -> str:
    """The server's error message, unless it quotes request content (servers echo prompts)."""
    body = getattr(e, "body", None)
    msg = None
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else str(err)
    msg = " ".join(str(msg or getattr(e, "message", "") or "").split())[:300]
    if quotes_any(msg, sensitive):
        return "[server message withheld: it quotes the request]"
    return msg or "(no message)"


def quotes_any(text: str, sensitive: tuple[str, ...], window: int = 24) -> bool:
    """True if ``text`` contains any ``window``-character run of a sensitive text."""
    if not text or not sensitive:
        return False
    norm = " ".join(text.split())
    for s in sensitive:
        s = " ".join(s.split())
        if len(s) <= window:
            if s and s in norm:
                return True
            continue
        for i in range(0, max(1, len(norm) - window + 1)):
            if norm[i : i + window] in s:
                return True
    return False
