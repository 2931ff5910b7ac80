"""Response models of the probes (`/healthz`, `/readyz`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class EndpointStatus(BaseModel):
    endpoint: str = Field(description="formalizer server (scheme://host:port)")
    state: Literal["unknown", "up", "down"] = Field(
        description="up: lists both adapters; down: skipped until a health check finds it up again"
    )
    reason: str | None = Field(None, description="why it is down (or what it lacks)")
    models: list[str] = Field(default_factory=list, description="models it lists")
    in_flight: int = Field(0, description="requests this replica has in flight towards it")
    failures: int = Field(0, description="failed calls since the replica started")


class Readiness(BaseModel):
    ready: bool
    formalizer: str = Field(description="formalizer servers (scheme://host:port, comma-separated)")
    models: list[str] = Field(default_factory=list, description="models the formalizer server lists")
    missing: list[str] = Field(
        default_factory=list, description="adapters the service needs but the server lacks"
    )
    reason: str | None = None
    endpoints: list[EndpointStatus] = Field(
        default_factory=list, description="each formalizer server: ready when at least one is up"
    )
