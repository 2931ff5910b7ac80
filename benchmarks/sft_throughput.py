"""LoRA SFT throughput of the paper's recipe on Qwen2.5-7B-Instruct's exact architecture (one GPU).

    .venv/bin/python benchmarks/sft_throughput.py                       # on a GPU node (bf16)
    .venv/bin/python benchmarks/sft_throughput.py --records 5000 2000 --mean-tokens 1800
    .venv/bin/python benchmarks/sft_throughput.py --dataset EXPORT/parser --dataset EXPORT/value_miner \
        --tokenizer /models/Qwen2.5-7B-Instruct                          # sizes of real exported datasets
    .venv/bin/python benchmarks/sft_throughput.py --tiny                # CPU smoke run of this script

No weights are needed: the model is randomly initialized from Qwen2.5-7B-Instruct's architecture
(written below), in bf16, with the training recipe of configs/train (LoRA r=32, alpha=64, dropout
0.05 on q/k/v/o_proj, AdamW lr 2e-4, max length 4096, per-device batch 2, gradient accumulation 8,
activation checkpointing, loss on the last part of each sequence like an assistant turn).
Sequences are full length (the worst case). Prints tokens/s, seconds per optimizer step, peak GPU
memory, and projected hours for the given dataset sizes (3 epochs). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Qwen/Qwen2.5-7B-Instruct config.json (architecture fields)
QWEN2_5_7B_INSTRUCT = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    use_sliding_window=False,
    sliding_window=131072,
    max_window_layers=28,
    attention_dropout=0.0,
    bos_token_id=151643,
    eos_token_id=151645,
)
# --tiny: same code path on a CPU in seconds (head_dim 32)
TINY = dict(
    QWEN2_5_7B_INSTRUCT,
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_window_layers=2,
    bos_token_id=0,
    eos_token_id=1,
)


def build_model(arch: dict, device: str, dtype):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verdict.train.sft_config import LoraSpec

    cfg = Qwen2Config(**arch)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in bf16 directly: a 7B model in fp32 would need 30 GB first
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    lora = LoraSpec()  # the paper's recipe, as training uses it
    peft_cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def measure(a) -> dict:
    import torch
    from verdict.train.sft_config import TrainConfig

    recipe = TrainConfig(name="bench", task="parser", base_model="-", datasets=[{"path": "-"}])
    arch = TINY if a.tiny else QWEN2_5_7B_INSTRUCT
    device = "cpu" if a.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no GPU visible (run on a GPU node, or --tiny for a CPU smoke run)")
    dtype = torch.float32 if a.tiny else torch.bfloat16
    seq = a.seq_len or (128 if a.tiny else recipe.max_length)
    bs = a.batch_size or recipe.batch_size
    accum = a.grad_accum or (1 if a.tiny else recipe.grad_accum)
    t_build = time.perf_counter()
    model = build_model(arch, device, dtype)
    build_s = time.perf_counter() - t_build
    if recipe.gradient_checkpointing:
        model.activation_checkpointing_enable()
        model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    total = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompt_len = int(seq * (1 - a.assistant_fraction))

    def micro_batch():
        ids = torch.randint(0, arch["vocab_size"], (bs, seq), generator=gen).to(device)
        labels = ids.clone()
        labels[:, :prompt_len] = -100  # assistant-only loss: the prompt carries none
        return ids, labels

    def step():
        for _ in range(accum):
            ids, labels = micro_batch()
            with torch.autocast(device_type=device, dtype=dtype, enabled=not a.tiny):
                loss = model(input_ids=ids, labels=labels).loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup_steps):
        step()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    tokens = a.steps * accum * bs * seq
    return {
        "model": "tiny (CPU smoke run)" if a.tiny else "Qwen2.5-7B-Instruct architecture, random init",
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "seq_len": seq,
        "batch_size": bs,
        "grad_accum": accum,
        "lora": {
            "r": recipe.lora.r,
            "alpha": recipe.lora.alpha,
            "dropout": recipe.lora.dropout,
            "target_modules": recipe.lora.target_modules,
        },
        "activation_checkpointing": recipe.gradient_checkpointing,
        "params_total": total,
        "params_trainable": trainable,
        "build_seconds": round(build_s, 1),
        "steps_timed": a.steps,
        "seconds_per_step": round(dt / a.steps, 3),
        "tokens_per_second": round(tokens / dt, 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
    }


def dataset_tokens(paths: list[str], tokenizer: str) -> list[tuple[str, int, int]]:
    from transformers import AutoTokenizer
    from verdict.train.sft_data import load_dataset_dict
    from verdict.train.sft_trainer import token_lengths

    tok = AutoTokenizer.from_pretrained(tokenizer)
    out = []
    for p in paths:
        train = load_dataset_dict(p)["train"]
        out.append((p, len(train), sum(token_lengths(tok, train))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU (checks the script runs)")
    ap.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=None, help="default: the recipe's max length (4096)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the recipe's (2)")
    ap.add_argument("--grad-accum", type=int, default=None, help="default: the recipe's (8)")
    ap.add_argument("--assistant-fraction", type=float, default=0.25, help="share of tokens carrying loss")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument(
        "--records",
        type=int,
        nargs="*",
        default=[1000, 5000, 20000],
        help="dataset sizes to project (records)",
    )
    ap.add_argument("--mean-tokens", type=int, default=2000, help="mean tokens per record for --records")
    ap.add_argument("--dataset", action="append", default=[], help="exported SFT dataset to project for")
    ap.add_argument(
        "--tokenizer", default=None, help="tokenizer for --dataset (your Qwen2.5-7B-Instruct copy)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args()
    if a.dataset and not a.tokenizer:
        raise SystemExit("error: --dataset needs --tokenizer (a local Qwen2.5-7B-Instruct folder)")

    r = measure(a)
    sizes = [(f"{n} records x {a.mean_tokens} tokens", n, n * a.mean_tokens) for n in a.records]
    if a.dataset:
        sizes += [(f"{p} (train split)", n, toks) for p, n, toks in dataset_tokens(a.dataset, a.tokenizer)]
    r["projections"] = [
        {
            "dataset": label,
            "records": n,
            "tokens_per_epoch": toks,
            "epochs": a.epochs,
            "hours": round(a.epochs * toks / r["tokens_per_second"] / 3600, 2),
        }
        for label, n, toks in sizes
    ]
    print(
        f"{r['model']} on {r['device']} ({r['dtype']}), seq {r['seq_len']}, batch {r['batch_size']} x "
        f"{r['grad_accum']} accumulation, LoRA r={r['lora']['r']} on {','.join(r['lora']['target_modules'])}"
    )
    print(f"  trainable {r['params_trainable'] / 1e6:.1f}M of {r['params_total'] / 1e9:.2f}B parameters")
    print(
        f"  {r['tokens_per_second']:.0f} tokens/s, {r['seconds_per_step']:.2f} s per optimizer step, "
        f"peak memory {r['peak_memory_gib'] if r['peak_memory_gib'] is not None else 'n/a'} GiB"
    )
    for p in r["projections"]:
        print(
            f"  {p['dataset']}: {p['tokens_per_epoch']} tokens/epoch -> "
            f"{p['hours']} h for {p['epochs']:g} epochs"
        )
    if a.json:
        a.json.write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
