"""LoRA distillation of a student with TRL's SFTTrainer + PEFT.

    cfg = load_train_config("configs/train/value_miner.yaml", ["lr=1e-4"])
    result = train(cfg)              # checks everything first, then trains, resumes, writes the run dir

Before any step is paid for, ``prepare`` refuses: a base model path that is not a local model, a
dataset of the wrong task or schema, a chat template with no ``{% generation %}`` markers (and no
training variant TRL knows) when assistant-only loss is on, bf16 on a CPU. A run killed (or sent
SIGTERM/SIGINT, e.g. by SLURM before its time limit) resumes from its last checkpoint when the
same command is run again; a completed run is not trained twice.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from verdict.core import configs
from verdict.core.errors import VerdictError
from verdict.core.progress import Progress, to_stderr

from . import sft_data
from .model_card import render_model_card
from .peft_quiet import peft_quietly
from .run_dir import RunDir, RunError, code_version, library_versions, write_atomic
from .sft_config import TrainConfig

if TYPE_CHECKING:
    from datasets import Dataset

# Changing these does not change what is trained, so a resumed run may differ in them.
BOOKKEEPING_KEYS = {"logging_steps", "save_steps", "save_total_limit", "merge"}


class TrainError(VerdictError):
    """The run cannot start: bad base model, chat template, device or data."""


class TrainingInterrupted(VerdictError):
    """Training stopped on a signal after saving a checkpoint; run the same command to resume."""


@dataclass
class Prepared:
    cfg: TrainConfig
    tokenizer: object
    train_set: Dataset
    eval_set: Dataset | None
    datasets: list[dict]
    dropped_overlong: int
    train_tokens: int
    training_template: str | None
    inference_template: str | None = None


@dataclass
class TrainResult:
    run_dir: Path
    adapter_dir: Path
    global_step: int
    status: str
    resumed_from: str | None = None
    metrics: dict = field(default_factory=dict)


# ---- checks -------------------------------------------------------------------------------------
def check_base_model(path: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise TrainError(
            f"base_model '{path}' does not exist (a local model folder is expected; nothing is "
            "fetched from a hub: point base_model at your copy of Qwen2.5-7B-Instruct)"
        )
    if not (p / "config.json").is_file():
        raise TrainError(f"base_model '{path}' has no config.json: not a Hugging Face model folder")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise TrainError(
            f"base_model '{path}' has no tokenizer files (tokenizer.json / tokenizer_config.json)"
        )


def check_init_adapter(cfg: TrainConfig) -> None:
    if cfg.init_adapter is None:
        return
    p = Path(cfg.init_adapter)
    if not (p / "adapter_config.json").is_file():
        raise TrainError(
            f"init_adapter '{cfg.init_adapter}' is not a LoRA adapter folder (no adapter_config.json)"
        )
    if "lora" in cfg.model_fields_set:
        import json

        ac = json.loads((p / "adapter_config.json").read_text())
        theirs = (ac.get("r"), ac.get("lora_alpha"), sorted(ac.get("target_modules") or []))
        ours = (cfg.lora.r, cfg.lora.alpha, sorted(cfg.lora.target_modules))
        if theirs != ours:
            raise TrainError(
                f"init_adapter has LoRA r={theirs[0]}, alpha={theirs[1]} on {theirs[2]} but the config "
                f"asks for r={ours[0]}, alpha={ours[1]} on {ours[2]}: drop the 'lora' settings "
                "(training continues the adapter as it is)"
            )


def training_chat_template(tokenizer, assistant_only_loss: bool) -> str | None:
    """The template TRL will train with: None = the tokenizer's own. Refuses a template without
    ``{% generation %}`` markers that TRL has no training variant for."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if not template:
        raise TrainError(
            "the base model's tokenizer has no chat template (the students are trained on "
            "chat-formatted records; use an instruct model such as Qwen2.5-7B-Instruct)"
        )
    if not assistant_only_loss or has_generation_markers(
        template if isinstance(template, str) else template.get("default", "")
    ):
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        raise TrainError(
            "assistant-only loss needs a chat template with {% generation %} ... {% endgeneration %} markers "
            "around the assistant turn, and the base model's template has none (TRL knows training variants "
            "of the official Qwen2.5 and a few other templates only): add the markers to the template in "
            "tokenizer_config.json, or set assistant_only_loss: false"
        ) from None


PROBE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
]


def use_training_template(tokenizer, path: str) -> None:
    """Train with a marked copy of the model's template; it must render conversations exactly as the
    model's own template does, or the student would learn a format it never sees at inference."""
    from trl.chat_template_utils import has_generation_markers

    p = Path(path)
    if not p.is_file():
        raise TrainError(f"training_chat_template '{path}' does not exist")
    marked = p.read_text()
    if not has_generation_markers(marked):
        raise TrainError(f"training_chat_template '{path}' has no {{% generation %}} markers")
    for msgs, gen in ((PROBE, False), (PROBE[:2], True)):
        ours = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        theirs = tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen, chat_template=marked
        )
        if ours != theirs:
            raise TrainError(
                f"training_chat_template '{path}' renders conversations differently from the base model's "
                "chat template: it must be the same template with {% generation %} markers added"
            )
    tokenizer.chat_template = marked


def token_lengths(tokenizer, ds: Dataset) -> list[int]:
    out = []
    for msgs in ds["messages"]:
        ids = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=False)
        out.append(len(ids))
    return out


def resolve_device(cfg: TrainConfig) -> str:
    import torch

    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainError("device: cuda was asked for but no GPU is visible (CUDA_VISIBLE_DEVICES, drivers?)")
    if cfg.bf16 and device == "cpu":
        raise TrainError("bf16: true needs a GPU; for a CPU run set bf16: false (e.g. --set bf16=false)")
    if cfg.bf16 and not torch.cuda.is_bf16_supported():
        raise TrainError("bf16: true but this GPU has no bf16 support; set bf16: false")
    return device


def prepare(cfg: TrainConfig, progress: Progress = to_stderr) -> Prepared:
    """Every check that can fail, before a model is loaded or a step paid for."""
    from datasets import concatenate_datasets
    from transformers import AutoTokenizer

    cfg = cfg.resolved()
    check_base_model(cfg.base_model)
    check_init_adapter(cfg)
    resolve_device(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.base_model)
    original_template = tokenizer.chat_template
    if cfg.training_chat_template:
        use_training_template(tokenizer, cfg.training_chat_template)
    template = training_chat_template(tokenizer, cfg.assistant_only_loss)

    splits = [cfg.train_split] + ([cfg.eval_split] if cfg.eval_split else [])
    parts, infos, evals = [], [], []
    for spec in cfg.datasets:
        loaded = sft_data.load_checked(spec.path, cfg.task, splits)
        tr = loaded[cfg.train_split]
        if len(tr) == 0:
            raise sft_data.DatasetError(f"dataset '{spec.path}' split '{cfg.train_split}' is empty")
        parts.append((tr, spec.weight))
        infos.append(
            {
                "label": spec.label,
                "path": spec.path,
                "weight": spec.weight,
                "train_records": len(tr),
                "fingerprint": sft_data.fingerprint(tr),
                "card_task": sft_data.card_task(spec.path),
            }
        )
        if cfg.eval_split and len(loaded[cfg.eval_split]):
            ev = loaded[cfg.eval_split]
            infos[-1]["eval_fingerprint"] = sft_data.fingerprint(ev)
            evals.append(ev.select_columns(["messages"]))
    train_set = sft_data.mix(parts, cfg.seed)
    eval_set = concatenate_datasets(evals) if evals else None

    lengths = token_lengths(tokenizer, train_set)
    keep = [i for i, n in enumerate(lengths) if n <= cfg.max_length]
    dropped = len(lengths) - len(keep)
    if dropped and cfg.overlong == "error":
        raise sft_data.DatasetError(
            f"{dropped} training record(s) are longer than max_length={cfg.max_length} "
            f"tokens (longest: {max(lengths)}); raise max_length or set overlong: drop"
        )
    if dropped:
        progress(
            f"warning: dropping {dropped} of {len(lengths)} training records longer than "
            f"{cfg.max_length} tokens"
        )
        train_set = train_set.select(keep)
    if len(train_set) == 0:
        raise sft_data.DatasetError("no training records left after dropping over-long ones")
    if eval_set is not None:
        ev_len = token_lengths(tokenizer, eval_set)
        eval_set = eval_set.select([i for i, n in enumerate(ev_len) if n <= cfg.max_length])
    return Prepared(
        cfg=cfg,
        tokenizer=tokenizer,
        train_set=train_set,
        eval_set=eval_set or None,
        datasets=infos,
        dropped_overlong=dropped,
        train_tokens=sum(lengths[i] for i in keep),
        training_template=template,
        inference_template=original_template,
    )


# ---- the run directory ---------------------------------------------------------------------------
def _config_dump(cfg: TrainConfig) -> dict:
    """The run's config.yaml. A run that continues an adapter without 'lora' settings trains that
    adapter as it is, so its LoRA settings are recorded, not the defaults: the file describes the
    run and trains it again as given."""
    dump = cfg.model_dump(mode="json")
    if cfg.init_adapter and "lora" not in cfg.model_fields_set:
        import json

        ac = json.loads((Path(cfg.init_adapter) / "adapter_config.json").read_text())
        dump["lora"] = {
            "r": ac["r"],
            "alpha": ac["lora_alpha"],
            "dropout": ac.get("lora_dropout", 0.0),
            "target_modules": sorted(ac["target_modules"]),
        }
    return dump


def _differences(old: dict, new: dict) -> list[str]:
    keys = sorted((set(old) | set(new)) - BOOKKEEPING_KEYS)
    return [k for k in keys if old.get(k) != new.get(k)]


def open_for_training(prep: Prepared, overwrite: bool) -> tuple[RunDir, str]:
    """Returns the run dir and its state: 'new', 'resume' or 'completed'."""
    run = RunDir(prep.cfg.run_dir)
    if run.path.exists() and overwrite:
        for p in (
            run.config,
            run.info,
            run.checkpoints,
            run.tensorboard,
            run.adapter,
            run.merged,
            run.path / "eval",
        ):
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    if run.config.is_file():
        diff = _differences(configs.read_yaml(run.config, RunError), _config_dump(prep.cfg))
        if diff:
            raise RunError(
                f"run directory '{run.path}' holds a run with a different config (differs in: "
                f"{', '.join(diff)}); choose another name or output_dir, or pass --overwrite"
            )
        info = run.read_info()
        old_fp = [d.get("fingerprint") for d in info.get("datasets", [])]
        if old_fp and old_fp != [d["fingerprint"] for d in prep.datasets]:
            raise RunError(
                f"run directory '{run.path}' was trained on different data (dataset fingerprints "
                "changed); choose another name, or pass --overwrite to start again"
            )
        if info.get("status") == "completed" and (run.adapter / "adapter_config.json").is_file():
            return run, "completed"
        return run, "resume"
    if run.path.exists() and any(run.path.iterdir()):
        raise RunError(
            f"'{run.path}' exists and is not a training run directory; choose another name or output_dir"
        )
    run.path.mkdir(parents=True, exist_ok=True)
    write_atomic(run.config, yaml.safe_dump(_config_dump(prep.cfg), sort_keys=False))
    return run, "new"


# ---- callbacks -----------------------------------------------------------------------------------
def _callbacks(run: RunDir, progress: Progress):
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerCallback
    from transformers.integrations import TensorBoardCallback

    class Progress(TrainerCallback):
        """One line per logging step: plain text reads well in SLURM logs."""

        def __init__(self):
            self.t0 = time.time()
            self.start_step = 0

        def on_train_begin(self, args, state, control, **kw):
            self.t0, self.start_step = time.time(), state.global_step

        def on_log(self, args, state, control, logs=None, **kw):
            if not logs:
                return
            done = state.global_step - self.start_step
            el = time.time() - self.t0
            eta = el / done * (state.max_steps - state.global_step) if done else 0.0
            vals = " ".join(
                f"{k} {v:.4g}"
                for k, v in logs.items()
                if isinstance(v, (int, float)) and k in ("loss", "eval_loss", "learning_rate", "grad_norm")
            )
            if vals:
                progress(
                    f"step {state.global_step}/{state.max_steps} {vals} elapsed {el:.0f}s eta {eta:.0f}s"
                )

    class StopOnSignal(TrainerCallback):
        """SIGTERM/SIGINT (SLURM's warning before a time limit, Ctrl-C): save a checkpoint at the end
        of the current step and stop; a second signal kills as usual."""

        def __init__(self):
            self.signum = None
            self._old = {}

        def _handler(self, signum, frame):
            self.signum = signum
            for s, h in self._old.items():
                signal.signal(s, h)

        def on_train_begin(self, args, state, control, **kw):
            for s in (signal.SIGTERM, signal.SIGINT):
                try:
                    self._old[s] = signal.signal(s, self._handler)
                except ValueError:  # not the main thread: leave signals alone
                    pass

        def on_step_end(self, args, state, control, **kw):
            if self.signum is not None:
                control.should_save = True
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kw):
            for s, h in self._old.items():
                signal.signal(s, h)
            self._old = {}

    stop = StopOnSignal()
    tb = TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(run.tensorboard)))
    return [Progress(), stop, tb], stop


def build_trainer(prep: Prepared, run: RunDir, callbacks: list):
    import torch
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    cfg = prep.cfg
    device = resolve_device(cfg)
    model = AutoModelForCausalLM.from_pretrained(
        cfg.base_model, dtype=torch.bfloat16 if cfg.bf16 else torch.float32
    )
    peft_config = None
    if cfg.init_adapter:
        with peft_quietly():
            model = PeftModel.from_pretrained(model, cfg.init_adapter, is_trainable=True)
    else:
        peft_config = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
    args = SFTConfig(
        output_dir=str(run.checkpoints),
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio,  # < 1: a ratio
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=cfg.bf16,
        fp16=False,
        use_cpu=device == "cpu",
        activation_checkpointing=cfg.gradient_checkpointing,
        max_length=cfg.max_length,
        assistant_only_loss=cfg.assistant_only_loss,
        packing=False,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        eval_strategy="steps" if prep.eval_set is not None else "no",
        eval_steps=cfg.save_steps,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    with peft_quietly():  # the trainer wraps the model with peft (get_peft_model)
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=prep.train_set,
            eval_dataset=prep.eval_set,
            processing_class=prep.tokenizer,
            peft_config=peft_config,
            callbacks=callbacks,
        )
    trainer.remove_callback(PrinterCallback)  # raw dicts on stdout; Progress logs readable lines instead
    return trainer


# ---- the run -------------------------------------------------------------------------------------
def checkpoint_complete(checkpoint: Path) -> bool:
    """Whether the trainer finished saving this checkpoint: its trainer_state.json, written last and
    in place (a kill mid-write leaves it cut short, even empty), reads as JSON."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return True


def last_checkpoint(folder: Path, progress: Progress = to_stderr) -> str | None:
    """The newest *complete* checkpoint (`checkpoint_complete`); a checkpoint cut short by a kill
    holds nothing usable and is removed so the trainer can write that step again."""
    if not folder.is_dir():
        return None
    found = sorted(
        (int(p.name.split("-")[1]), p)
        for p in folder.glob("checkpoint-*")
        if p.is_dir() and p.name.split("-")[1].isdigit()
    )
    for _, p in reversed(found):
        if checkpoint_complete(p):
            return str(p)
        progress(f"warning: removing incomplete {p.name} (the run was killed while saving it)")
        shutil.rmtree(p)
    return None


def train(cfg: TrainConfig, overwrite: bool = False, progress: Progress = to_stderr) -> TrainResult:
    prep = prepare(cfg, progress)
    cfg = prep.cfg
    run, state = open_for_training(prep, overwrite)
    if state == "completed":
        info = run.read_info()
        progress(f"run '{cfg.name}' is already complete ({run.path}); pass --overwrite to train again")
        return TrainResult(
            run.path,
            run.adapter,
            info.get("global_step", 0),
            "completed",
            info.get("resumed_from"),
            info.get("metrics", {}),
        )
    last = last_checkpoint(run.checkpoints, progress)
    run.write_info(
        status="running",
        task=cfg.task,
        code_version=code_version(),
        libraries=library_versions(),
        datasets=prep.datasets,
        train_records=len(prep.train_set),
        eval_records=len(prep.eval_set) if prep.eval_set is not None else 0,
        dropped_overlong=prep.dropped_overlong,
        train_tokens_per_epoch=prep.train_tokens,
        resumed_from=Path(last).name if last else None,
    )
    progress(
        f"run '{cfg.name}': {len(prep.train_set)} training records ({prep.train_tokens} tokens/epoch) "
        f"-> {run.path}" + (f"; resuming from {Path(last).name}" if last else "")
    )
    callbacks, stop = _callbacks(run, progress)
    trainer = build_trainer(prep, run, callbacks)
    t0 = time.time()
    out = trainer.train(resume_from_checkpoint=last)
    wall = time.time() - t0
    step = trainer.state.global_step
    if stop.signum is not None and step < trainer.state.max_steps:
        run.write_info(status="interrupted", global_step=step)
        raise TrainingInterrupted(
            f"training stopped by signal {stop.signum} at step {step}; checkpoint saved in "
            f"{run.checkpoints}: run the same command again to resume"
        )

    metrics = {k: v for k, v in out.metrics.items() if isinstance(v, (int, float))}
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    if evals:
        metrics["eval_loss"] = evals[-1]
    metrics["global_step"] = step
    trainer.save_model(str(run.adapter))
    prep.tokenizer.chat_template = prep.inference_template  # the adapter ships the model's own template
    prep.tokenizer.save_pretrained(str(run.adapter))
    info = run.write_info(status="completed", global_step=step, metrics=metrics, wall_seconds=round(wall, 1))
    (run.adapter / "README.md").write_text(render_model_card(cfg, info))
    if cfg.merge:
        merge(run.path, progress=progress)
    progress(f"done: {step} steps in {wall:.0f}s; adapter in {run.adapter}")
    return TrainResult(run.path, run.adapter, step, "completed", info.get("resumed_from"), metrics)


def merge(run_path: str | Path, out: str | Path | None = None, progress: Progress = to_stderr) -> Path:
    """Write the base model with the run's adapter merged in (for export to tools without LoRA)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .run_dir import open_run

    run = open_run(run_path)
    cfg = TrainConfig.model_validate(run.read_config())
    if not (run.adapter / "adapter_config.json").is_file():
        raise RunError(f"run '{run.path}' has no adapter yet (training not complete)")
    check_base_model(cfg.base_model)
    dest = Path(out) if out else run.merged
    base = AutoModelForCausalLM.from_pretrained(
        cfg.base_model, dtype=torch.bfloat16 if cfg.bf16 else torch.float32
    )
    with peft_quietly():
        merged = PeftModel.from_pretrained(base, str(run.adapter)).merge_and_unload()
    merged.save_pretrained(str(dest))
    AutoTokenizer.from_pretrained(str(run.adapter)).save_pretrained(str(dest))
    progress(f"merged model written to {dest}")
    return dest
