"""Backend registry: `recorded`, `formalizer`, `llm_match`, `predictions` (see base.py)."""

from . import formalizer, llm_match, predictions, recorded  # noqa: F401  (register the kinds)
from .base import BACKENDS, Backend, BackendConfig, RunContext, backend_config, make_backend, register_backend

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendConfig",
    "RunContext",
    "backend_config",
    "make_backend",
    "register_backend",
]
