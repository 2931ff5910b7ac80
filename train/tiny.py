"""Build a tiny, offline Qwen2-architecture student for tests, CI and the demo.

Real Qwen2.5 weights exist only at sites; here a ~1.5 MB random Qwen2 with a small byte-level BPE
tokenizer and the official Qwen2.5 chat template stands in for it. Settings that matter (measured,
see the project notes): head_dim >= 32 for vLLM's CPU attention, initializer_range 0.1 so LoRA can
learn at all with frozen tied embeddings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# A few KB of text in the shape of what the students read and write, so the BPE learns useful merges.
_CORPUS = """You are a clinical trial eligibility formalizer. Return only JSON.
{"atoms": [{"name": "has_type_2_diabetes", "domain": "bool", "kind": "diagnosis", "unit": null,
"definition": "The patient has a diagnosis of type 2 diabetes mellitus."}], "cohorts": [{"id": "main",
"inclusion": [{"id": "inc1", "text": "Age 18 years or older", "formula": {"op": "cmp", "lhs": "age_years",
"rel": "ge", "rhs": 18}}], "exclusion": [{"id": "exc1", "text": "Pregnancy", "formula": "is_pregnant"}]}]}
{"values": [{"atom": "age_years", "value": 58, "evidence": "A 58-year-old woman"},
{"atom": "is_pregnant", "value": false, "evidence": "postmenopausal"}, {"atom": "creatinine_mg_dl",
"value": null, "evidence": ""}]}
Inclusion Criteria: adults with hypertension, creatinine <= 2.0 mg/dL, HbA1c between 7% and 10%.
Exclusion Criteria: pregnancy, history of stroke within 6 months, active cancer, dialysis.
A 62-year-old man presents with chest pain, diabetes and chronic kidney disease. He denies smoking.
0123456789 true false null [] {} ( ) : ; , . ! ? ' " - _ + = * / < > @ # % & |
"""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(vocab_size: int = 512, extra_corpus: str = ""):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    qwen_split = (
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    )
    tk = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([_CORPUS + extra_corpus] * 20, trainer=trainer)
    return _chat_tokenizer(tokenizer_object=tk)


def build_tiny_student(
    out_dir: str | os.PathLike,
    hidden_size: int = 128,
    layers: int = 2,
    seed: int = 0,
    vocab_size: int = 512,
    extra_corpus: str = "",
) -> Path:
    """Write a tiny random Qwen2ForCausalLM + tokenizer to ``out_dir`` (about 1.5 MB, < 1 s).

    ``extra_corpus`` (e.g. the prompt templates) with a larger ``vocab_size`` gives a tokenizer that
    knows the prompts' words: prompts 2-3x shorter, so training and serving the tiny students is
    that much cheaper."""
    tok = build_tokenizer(vocab_size, extra_corpus)
    return _write_tiny_qwen2(
        out_dir, tok, ((len(tok) + 63) // 64) * 64, 4096, "tiny-qwen2-student", hidden_size, layers, seed
    )


def _write_tiny_qwen2(
    out_dir: str | os.PathLike,
    tok,
    vocab: int,
    max_positions: int,
    kind: str,
    hidden_size: int,
    layers: int,
    seed: int,
) -> Path:
    """A random Qwen2ForCausalLM for `tok` (head_dim 32: vLLM's CPU attention needs >= 32;
    initializer_range 0.1: LoRA cannot learn past frozen tied embeddings at 0.02), saved with it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        initializer_range=0.1,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(cfg)
    gen = model.generation_config
    gen.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    gen.pad_token_id = tok.pad_token_id
    gen.do_sample = False
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "verdict_tiny.json").write_text(
        json.dumps({"kind": kind, "seed": seed, "hidden_size": hidden_size, "layers": layers}, indent=2)
    )
    return out


QWEN25_PADDED_VOCAB = 151_936  # Qwen2.5's embedding rows (151,665 tokens, padded)


def build_qwen25_tokenizer():
    """The real Qwen2.5 tokenizer (rebuilt offline, data_gen/formalizer/budget.py) as a Hugging
    Face tokenizer with the official Qwen2.5 chat template."""
    from verdict.data_gen.formalizer import qwen25_tokenizer_file

    return _chat_tokenizer(tokenizer_file=str(qwen25_tokenizer_file()), split_special_tokens=False)


def _chat_tokenizer(**source):
    """A Hugging Face tokenizer with Qwen2.5's special tokens and official chat template, over
    `source` (its tokenizer_object or tokenizer_file, and further options)."""
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = PreTrainedTokenizerFast(
        **source,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = qwen2_5_chat_template
    return tok


def build_qwen25_student(
    out_dir: str | os.PathLike, hidden_size: int = 128, layers: int = 2, seed: int = 0
) -> Path:
    """A tiny random Qwen2 carrying the REAL Qwen2.5 vocabulary and chat template (~80 MB: the
    152k-row tied embedding). For serving tests of real-vocabulary behaviour (token counts,
    structured outputs, the chat template); too slow to train on a CPU."""
    return _write_tiny_qwen2(
        out_dir,
        build_qwen25_tokenizer(),
        QWEN25_PADDED_VOCAB,
        32768,
        "tiny-qwen2-real-vocab",
        hidden_size,
        layers,
        seed,
    )
