"""Shared test helpers: paths, and `need()` for tests that use real services."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"  # the shared data folder beside the checkout (as in CI)
SHARED_DATA = SHARED / "data"
REFERENCE_V6 = SHARED_DATA / "reference" / "v6"
BENCHMARKS = SHARED_DATA / "benchmarks"


def need(ok: bool, why: str) -> None:
    """Skip when a real dependency (vLLM env, SLURM, Chromium, shared data) is missing locally;
    in CI (VERDICT_REQUIRE_ALL=1) a missing dependency is a failure, never a silent skip."""
    if ok:
        return
    if os.environ.get("VERDICT_REQUIRE_ALL") == "1":
        pytest.fail(f"required dependency missing: {why}")
    pytest.skip(why)
