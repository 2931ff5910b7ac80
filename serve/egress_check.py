"""The start-time egress check: the service refuses to start if patient text could go to a formalizer
host the site has not allowed (any endpoint of the pool may get any request)."""

from __future__ import annotations

from urllib.parse import urlsplit

from verdict.data_gen.formalizer import EGRESS_RULE, EgressPolicy
from verdict.data_gen.formalizer import ENV_ALLOW as EGRESS_ENV

from .errors import ServeConfigError


def check_formalizer_hosts(egress: EgressPolicy, base_urls: list[str]) -> None:
    """ServeConfigError naming the first formalizer host not on the site allowlist."""
    for url in base_urls:
        host = egress.refused_host(url)
        if host is not None:
            raise ServeConfigError(
                f"refusing to start: the formalizer host '{host}' is not on the site allowlist for patient "
                f"text (rule: {EGRESS_RULE}); add it to api.egress.allow_hosts in the serve config or to "
                f"${EGRESS_ENV}"
            )


def origin_of(url: str) -> str:
    """`scheme://host:port` of a URL: how a formalizer server is named in answers (never its path)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
