"""Fixtures shared across parts live in tests/fixtures/, one module per real service."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = [
    "tests.fixtures.fhir_server",
    "tests.fixtures.models",
    "tests.fixtures.oauth_server",
    "tests.fixtures.postgres",
    "tests.fixtures.omop",  # after postgres: it builds on that cluster
    "tests.fixtures.scripted_api",
    "tests.fixtures.sft",
    "tests.fixtures.slurm",
    "tests.fixtures.vllm",
]
