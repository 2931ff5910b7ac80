"""The GPU memory formula: Qwen2.5-7B's published size, and the docs' table is the formula's."""

from __future__ import annotations

from verdict.serve.vllm.gpu_sizing import PAPER_LORA, QWEN25_7B, estimate, parameter_count, sizing_table

from tests.support import REPO

DOC_CONCURRENCY = [1, 8, 16, 32, 64, 128, 256]


def test_qwen25_7b_counts_as_published():
    # Qwen2.5-7B: 7.61 B parameters (model card); KV cache 2 x 28 layers x 4 KV heads x 128 x 2 bytes
    assert abs(parameter_count(QWEN25_7B) - 7.61e9) / 7.61e9 < 0.005
    e = estimate(QWEN25_7B, "bfloat16", [PAPER_LORA, PAPER_LORA], 4096, 64)
    assert e.kv_per_token == 2 * 28 * 4 * 128 * 2
    assert e.total == e.weights + e.adapters + e.kv_per_token * 4096 * 64
    assert e.weights == parameter_count(QWEN25_7B) * 2


def test_the_docs_sizing_table_is_the_formulas():
    docs = (REPO / "docs" / "deploy.md").read_text()
    assert sizing_table(DOC_CONCURRENCY) in docs, "regenerate with `verdict serve sizing --table`"
