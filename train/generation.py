"""Batched greedy generation with a student (base model + LoRA adapter) through transformers.

Used by `verdict train eval`, where the point is to measure the trained weights as they are; the
serving path (vLLM with JSON-schema-constrained decoding) lives in serve/. Here outputs are
*checked* against the core's schema afterwards, never constrained, so schema validity is a real
measurement of what the student learned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .peft_quiet import peft_quietly

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass
class Generated:
    text: str
    new_tokens: int
    seconds: float  # wall time of the batch this record was generated in
    batch_size: int


class Generator:
    def __init__(
        self,
        base_model: str,
        adapter: str | None = None,
        device: Literal["auto", "cpu", "cuda"] = "auto",
        dtype: Literal["auto", "bfloat16", "float32"] = "auto",
        max_new_tokens: int = 3072,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        self.device = device
        self.max_new_tokens = max_new_tokens
        # The adapter folder carries the tokenizer the student was trained with.
        tok_dir = adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else base_model
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.tokenizer.padding_side = "left"  # decoder-only batching: prompts end where generation starts
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=getattr(torch, dtype))
        if adapter:
            from peft import PeftModel

            with peft_quietly():
                model = PeftModel.from_pretrained(model, adapter)
        self.model = model.to(device).eval()
        vocab = self.tokenizer.get_vocab()
        self.stop_ids = [vocab[t] for t in STOP_TOKENS if t in vocab] or [self.tokenizer.eos_token_id]

    def prompt_text(self, messages: list[dict]) -> str:
        """System + user turns, ending with the assistant header (the same text training saw)."""
        prompt = [m for m in messages if m["role"] != "assistant"]
        return self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)

    def generate(self, conversations: list[list[dict]]) -> list[Generated]:
        """Greedy completions for one batch of conversations (assistant turns are ignored)."""
        import torch

        texts = [self.prompt_text(m) for m in conversations]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.stop_ids,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        if self.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        new = out[:, enc["input_ids"].shape[1] :]
        results = []
        for row in new.tolist():
            n, text_end = len(row), len(row)
            for i, t in enumerate(row):
                if t in self.stop_ids:
                    n, text_end = i + 1, i
                    break
            text = self.tokenizer.decode(row[:text_end], skip_special_tokens=False)
            results.append(Generated(text=text, new_tokens=n, seconds=dt, batch_size=len(texts)))
        return results
