"""The egress allowlist for patient text: the one place that decides where a request may go.

Rule: a request that carries patient text may go only to loopback (127.0.0.0/8, ::1, localhost)
or to a host the site allowed (config `egress.allow_hosts`, or `VERDICT_EGRESS_ALLOW`, comma
separated). Text from a dataset declared public or synthetic, and trial-only stages (public
criteria), may go anywhere. Host names are never resolved: the decision is made on the URL as
written, before any connection is opened, so DNS cannot move patient text elsewhere.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .endpoint_config import EgressConfig, EndpointConfig
from .errors import EgressRefused

ENV_ALLOW = "VERDICT_EGRESS_ALLOW"
EGRESS_RULE = "patient text goes only to loopback or to hosts on the site's egress allowlist"


@dataclass(frozen=True)
class EgressPolicy:
    allow_loopback: bool = True
    allow_hosts: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_config(cls, cfg: EgressConfig | None = None, *, env: bool = True) -> EgressPolicy:
        cfg = cfg or EgressConfig()
        hosts = list(cfg.allow_hosts)
        if env and os.environ.get(ENV_ALLOW):
            hosts += [h.strip() for h in os.environ[ENV_ALLOW].split(",") if h.strip()]
        return cls(allow_loopback=cfg.allow_loopback, allow_hosts=tuple(h.lower() for h in hosts))

    # -- the decision ----------------------------------------------------------------------------
    def host_allowed(self, host: str) -> bool:
        host = host.lower().strip("[]").rstrip(".")
        if self.allow_loopback and is_loopback(host):
            return True
        for rule in self.allow_hosts:
            if rule.startswith("*."):
                if host.endswith(rule[1:]):
                    return True
            elif "/" in rule:
                try:
                    if ipaddress.ip_address(host) in ipaddress.ip_network(rule, strict=False):
                        return True
                except ValueError:
                    continue
            elif host == rule.strip("[]"):
                return True
        return False

    def refused_host(self, url: str) -> str | None:
        """The host of `url` when patient text may not go there, else None."""
        host = urlsplit(url).hostname or ""
        return None if self.host_allowed(host) else host

    def check(
        self,
        url: str,
        *,
        carries_patient_text: bool,
        data_class: str = "private",
        what: str = "request",
        via_proxy: str | None = None,
    ) -> None:
        """Raise EgressRefused unless a request to ``url`` (and its proxy) is allowed."""
        if not carries_patient_text or data_class in ("public", "synthetic"):
            return
        for label, target in (("host", url), ("proxy", via_proxy)):
            host = None if target is None else self.refused_host(target)
            if host is not None:
                raise EgressRefused(
                    f"refused: {what} would send patient text (dataset class '{data_class}') to {label} "
                    f"'{host}', which is not allowed (rule: {EGRESS_RULE}). Nothing was sent. "
                    "To allow it, add "
                    f"'{host}' to egress.allow_hosts in the run config or to ${ENV_ALLOW}; if the notes are "
                    "public or synthetic, declare it with patients.data_class: public|synthetic"
                )

    def check_endpoint(self, ep: EndpointConfig, *, data_class: str, what: str) -> None:
        """Raise EgressRefused unless patient text of `data_class` may go to the endpoint (and its
        proxy)."""
        self.check(
            ep.base_url, carries_patient_text=True, data_class=data_class, what=what, via_proxy=ep.proxy
        )


def is_loopback(host: str) -> bool:
    host = host.lower().strip("[]").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
