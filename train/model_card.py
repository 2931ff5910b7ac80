"""The model card written next to every adapter (README.md, Hugging Face card layout, offline)."""

from __future__ import annotations

import yaml

from .sft_config import TrainConfig

TASK_TEXT = {
    "parser": "trial parser: eligibility criteria text -> typed trial program (ParsedTrial JSON)",
    "value_miner": "value miner: patient note + atoms -> value or null with a verbatim quote per atom "
    "(ValueMinerOutput JSON)",
}


def render_model_card(cfg: TrainConfig, info: dict) -> str:
    front = {
        "library_name": "peft",
        "base_model": cfg.base_model,
        "pipeline_tag": "text-generation",
        "tags": ["verdict", "lora", "sft", "trl", f"verdict-{cfg.task}"],
    }
    metrics = info.get("metrics", {})
    datasets = info.get("datasets", [])
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {cfg.name}: Verdict {cfg.task.replace('_', ' ')} student (LoRA)",
        "",
        f"Task: {TASK_TEXT[cfg.task]}.",
        "",
        "LLMs in Verdict only translate language; the Z3 core decides eligibility. This adapter was "
        "distilled from teacher outputs with TRL's SFTTrainer (loss on assistant tokens only).",
        "",
        "## Training data",
        "",
        "| dataset | weight | records (train) | fingerprint |",
        "|---|---|---|---|",
    ]
    for d in datasets:
        lines.append(f"| {d['label']} | {d['weight']} | {d['train_records']} | `{d['fingerprint'][:23]}` |")
    lines += [
        "",
        f"Training records after mixing: {info.get('train_records', '?')} "
        f"(dropped as longer than {cfg.max_length} tokens: {info.get('dropped_overlong', 0)}).",
        "",
        "## Recipe",
        "",
        f"- LoRA r={cfg.lora.r}, alpha={cfg.lora.alpha}, dropout={cfg.lora.dropout} on "
        f"{', '.join(cfg.lora.target_modules)}",
        f"- lr {cfg.lr:g} ({cfg.lr_scheduler}, warmup ratio {cfg.warmup_ratio:g}), "
        + (f"{cfg.max_steps} steps" if cfg.max_steps else f"{cfg.epochs:g} epochs")
        + f", batch {cfg.batch_size} x {cfg.grad_accum} accumulation, seed {cfg.seed}",
        f"- {'bf16' if cfg.bf16 else 'fp32'}, max length {cfg.max_length}, "
        f"assistant-only loss: {cfg.assistant_only_loss}",
        f"- initialized from adapter: {cfg.init_adapter}"
        if cfg.init_adapter
        else "- initialized: fresh LoRA",
        "",
        "## Results",
        "",
    ]
    for k in sorted(metrics):
        v = metrics[k]
        lines.append(f"- {k}: {v:.6g}" if isinstance(v, float) else f"- {k}: {v}")
    lines += [
        "",
        "Evaluate with `verdict train eval --run RUN --split test` (JSON and schema validity, atom "
        "agreement, decision agreement of the core).",
        "",
        "## Provenance",
        "",
        f"- code: {info.get('code_version', '?')}",
        f"- libraries: {', '.join(f'{k} {v}' for k, v in sorted(info.get('libraries', {}).items()))}",
        "",
    ]
    return "\n".join(lines)
