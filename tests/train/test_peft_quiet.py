"""The project wraps models with peft without transformers' `is_gradient_checkpointing`
FutureWarning (peft reads the deprecated property; issue 25: 18 of them in the suite), and any
other warning still shows."""

from __future__ import annotations

import warnings

import pytest
from verdict.train.peft_quiet import peft_quietly


def test_loading_an_adapter_shows_no_checkpointing_deprecation(tiny_model_dir, tmp_path):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from verdict.train.generation import Generator

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with peft_quietly():
        lora = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    lora.save_pretrained(tmp_path / "adapter")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Generator(str(tiny_model_dir), str(tmp_path / "adapter"), device="cpu", max_new_tokens=1)
    assert [str(w.message) for w in seen if "is_gradient_checkpointing" in str(w.message)] == []


def test_only_that_warning_is_silenced():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with peft_quietly():
            warnings.warn(
                "`is_gradient_checkpointing` is deprecated and will be removed", FutureWarning, stacklevel=1
            )
            warnings.warn("something else", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]
