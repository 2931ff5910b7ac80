"""The trainer (verdict.train.sft_trainer): refusals before any step, the loss mask, the run directory,
resuming a killed run, continuing an adapter on mixed data, merging."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verdict.train.run_dir import RunDir, RunError
from verdict.train.sft_config import TrainConfig, load_train_config
from verdict.train.sft_data import DatasetError
from verdict.train.sft_trainer import (
    TrainError,
    build_trainer,
    checkpoint_complete,
    last_checkpoint,
    merge,
    prepare,
    train,
)

from tests.fixtures.sft import TINY_OVERRIDES
from tests.support import REPO

VM_CONFIG = REPO / "configs" / "train" / "value_miner.yaml"
CHATML_WITHOUT_MARKERS = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_cfg(base, dataset, out, *extra) -> TrainConfig:
    return load_train_config(
        VM_CONFIG,
        TINY_OVERRIDES
        + [f"base_model={base}", f"datasets=[{{path: {dataset}}}]", f"output_dir={out}", "name=t", *extra],
    )


# ---- refused up front ----------------------------------------------------------------------------
def test_missing_base_model_is_refused(sft_export_dir, tmp_path):
    cfg = tiny_cfg(tmp_path / "no-such-model", sft_export_dir / "value_miner", tmp_path)
    with pytest.raises(TrainError, match="base_model '.*no-such-model' does not exist .*nothing is fetched"):
        prepare(cfg)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainError, match="has no config.json"):
        prepare(tiny_cfg(tmp_path / "empty", sft_export_dir / "value_miner", tmp_path))
    assert not (tmp_path / "t").exists()  # nothing written


def test_template_without_generation_markers_is_refused(tiny_model_dir, sft_export_dir, tmp_path):
    from transformers import AutoTokenizer

    base = tmp_path / "chatml-base"
    shutil.copytree(tiny_model_dir, base)
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = CHATML_WITHOUT_MARKERS
    tok.save_pretrained(base)
    cfg = tiny_cfg(base, sft_export_dir / "value_miner", tmp_path)
    with pytest.raises(
        TrainError, match=r"assistant-only loss needs a chat template with \{% generation %\}"
    ):
        prepare(cfg)
    # the same model trains on the full sequence if asked to
    assert prepare(cfg.model_copy(update={"assistant_only_loss": False})).training_template is None


def test_official_qwen_template_gets_the_training_variant(tiny_model_dir, sft_export_dir, tmp_path):
    prep = prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path))
    assert "{%- generation %}" in prep.training_template
    assert len(prep.train_set) == 8 and prep.dropped_overlong == 0
    assert prep.datasets[0]["train_records"] == 8 and prep.datasets[0]["fingerprint"].startswith("sha256:")


def test_wrong_task_dataset_and_bf16_on_cpu_are_refused(tiny_model_dir, sft_export_dir, tmp_path):
    with pytest.raises(DatasetError, match="is a 'parser' dataset"):
        prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "parser", tmp_path))
    with pytest.raises(TrainError, match="bf16: true needs a GPU"):
        prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path, "bf16=true"))


def test_overlong_records_are_dropped_or_refused(tiny_model_dir, sft_export_dir, tmp_path):
    from verdict.train.sft_trainer import token_lengths

    prep = prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path))
    lengths = sorted(token_lengths(prep.tokenizer, prep.train_set))
    cut = lengths[3]  # keeps the 4 shortest (and ties)
    dropped = sum(n > cut for n in lengths)
    prep2 = prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path, f"max_length={cut}"))
    assert prep2.dropped_overlong == dropped > 0 and len(prep2.train_set) == 8 - dropped
    with pytest.raises(
        DatasetError, match=f"{dropped} training record\\(s\\) are longer than max_length={cut}"
    ):
        prepare(
            tiny_cfg(
                tiny_model_dir,
                sft_export_dir / "value_miner",
                tmp_path,
                f"max_length={cut}",
                "overlong=error",
            )
        )


# ---- which tokens carry loss ---------------------------------------------------------------------
def test_loss_is_on_assistant_tokens_only(tiny_model_dir, sft_export_dir, tmp_path):
    prep = prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path))
    trainer = build_trainer(prep, RunDir(tmp_path / "run"), callbacks=[])
    tok = prep.tokenizer
    for i in range(len(prep.train_set)):
        messages = prep.train_set[i]["messages"]
        batch = trainer.data_collator([trainer.train_dataset[i]])
        ids, labels = batch["input_ids"][0], batch["labels"][0]
        mask = (labels != -100).tolist()
        first = mask.index(True)
        # one contiguous span at the end of the sequence, and labels equal the inputs there
        assert all(mask[first:]) and not any(mask[:first])
        assert (labels[first:] == ids[first:]).all()
        # the span is exactly the assistant turn: its JSON and the end-of-turn token the model must learn
        assert tok.decode(ids[first:]) == "\n" + messages[2]["content"] + "<|im_end|>\n"
        # everything before it is the prompt the student sees at inference
        prompt = tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
        assert tok.decode(ids[:first]) + "\n" == prompt
        assert messages[0]["content"] in prompt and messages[1]["content"] in prompt

    # control: without assistant-only loss every token is a label
    full = prepare(
        tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path, "assistant_only_loss=false")
    )
    t2 = build_trainer(full, RunDir(tmp_path / "run2"), callbacks=[])
    b = t2.data_collator([t2.train_dataset[0]])
    assert (b["labels"][0] != -100).all()


# ---- the run directory ---------------------------------------------------------------------------
@pytest.mark.slow  # trains the tiny student once per session (about 20 s)
def test_run_directory_holds_everything(tiny_value_miner_run):
    run = RunDir(tiny_value_miner_run)
    cfg = TrainConfig.model_validate(run.read_config())
    assert Path(cfg.base_model).is_absolute() and Path(cfg.datasets[0].path).is_absolute()
    info = run.read_info()
    assert info["status"] == "completed" and info["global_step"] == 60
    assert info["code_version"].startswith(("git:", "package:"))
    assert {"torch", "transformers", "peft", "trl"} <= set(info["libraries"])
    assert info["datasets"][0]["fingerprint"].startswith("sha256:") and info["train_records"] == 8
    assert info["metrics"]["train_loss"] > 0 and "eval_loss" in info["metrics"]
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= set(
        os.listdir(run.adapter)
    )
    adapter_cfg = json.loads((run.adapter / "adapter_config.json").read_text())
    assert (adapter_cfg["r"], adapter_cfg["lora_alpha"]) == (32, 64)
    assert sorted(adapter_cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert adapter_cfg["base_model_name_or_path"] == cfg.base_model
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    # the adapter ships the model's own template, not TRL's training variant
    assert AutoTokenizer.from_pretrained(run.adapter).chat_template == qwen2_5_chat_template
    card = (run.adapter / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: peft") and "LoRA r=32, alpha=64, dropout=0.05" in card
    assert info["datasets"][0]["fingerprint"][:23] in card and info["code_version"] in card


@pytest.mark.slow  # trains the tiny student once per session (about 20 s)
def test_metrics_are_tensorboard_readable(tiny_value_miner_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(RunDir(tiny_value_miner_run).tensorboard))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/loss" in tags and "eval/loss" in tags
    losses = [e.value for e in acc.Scalars("train/loss")]
    assert len(losses) >= 10 and losses[-1] < losses[0] / 5  # it learned


@pytest.mark.slow  # trains the tiny student once per session (about 20 s)
def test_completed_run_is_not_trained_twice_and_a_changed_config_is_refused(tiny_value_miner_run):
    run = RunDir(tiny_value_miner_run)
    cfg = TrainConfig.model_validate(run.read_config())
    before = (run.adapter / "adapter_model.safetensors").stat().st_mtime_ns
    t = time.monotonic()
    result = train(cfg)
    assert result.status == "completed" and result.global_step == 60 and time.monotonic() - t < 30
    assert (run.adapter / "adapter_model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(RunError, match=r"holds a run with a different config \(differs in: lr\)"):
        train(cfg.model_copy(update={"lr": 0.5}))


def _spawn_training(cfg_path: Path, *sets: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-c",
        "from verdict.cli import main; main()",
        "train",
        "--config",
        str(cfg_path),
    ]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240, done=Path.exists) -> None:
    deadline = time.monotonic() + timeout
    while not done(path):
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.05)


def _write_cfg(tmp_path, tiny_model_dir, dataset, name) -> Path:
    import yaml

    cfg = tiny_cfg(
        tiny_model_dir, dataset, tmp_path / "runs", f"name={name}", "save_steps=10", "max_steps=80"
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tiny_model_dir, sft_export_dir, tmp_path):
    cfg_path = _write_cfg(tmp_path, tiny_model_dir, sft_export_dir / "value_miner", "killed")
    run = RunDir(tmp_path / "runs" / "killed")
    proc = _spawn_training(cfg_path)
    # complete, not just begun: its trainer_state.json is written in place, after the rest
    _wait_for(run.checkpoints / "checkpoint-10", proc, done=checkpoint_complete)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert run.read_info()["status"] == "running"  # it never finished
    assert not (run.adapter / "adapter_config.json").exists()
    done = sorted(
        int(p.name.split("-")[1]) for p in run.checkpoints.glob("checkpoint-*") if checkpoint_complete(p)
    )
    assert done and done[-1] < 80

    result = train(load_train_config(cfg_path))
    assert result.status == "completed" and result.global_step == 80
    assert result.resumed_from == f"checkpoint-{done[-1]}"
    state = json.loads((run.checkpoints / "checkpoint-80" / "trainer_state.json").read_text())
    logged = [h["step"] for h in state["log_history"] if "loss" in h]
    assert logged[0] == 1 and logged[-1] == 80  # one history, continued across the kill
    assert (run.adapter / "adapter_model.safetensors").is_file()


def test_a_checkpoint_killed_while_its_state_was_written_is_not_resumed_from(tmp_path):
    """The trainer writes trainer_state.json last, in place: a kill mid-write leaves it cut short.
    Resuming from it failed on its JSON; the checkpoint before it is the last complete one."""
    state = {"global_step": 10, "log_history": []}
    for step, text in ((10, json.dumps(state)), (20, ""), (30, json.dumps(state)[:20])):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(text)
    said: list[str] = []
    assert last_checkpoint(tmp_path, said.append) == str(tmp_path / "checkpoint-10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]  # the cut-short ones removed
    assert len(said) == 2 and all("removing incomplete" in m for m in said)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_3(tiny_model_dir, sft_export_dir, tmp_path):
    # SLURM sends SIGTERM before a time limit (#SBATCH --signal=B:TERM@N)
    cfg_path = _write_cfg(tmp_path, tiny_model_dir, sft_export_dir / "value_miner", "termed")
    run = RunDir(tmp_path / "runs" / "termed")
    proc = _spawn_training(cfg_path, "save_steps=1000")
    _wait_for(run.tensorboard, proc)
    deadline = time.monotonic() + 120
    while not any(e.stat().st_size > 400 for e in run.tensorboard.glob("events*")):  # a few steps logged
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-2000:]
    assert "training stopped by signal 15" in err and "run the same command again to resume" in err
    info = run.read_info()
    assert info["status"] == "interrupted" and 0 < info["global_step"] < 80
    assert (run.checkpoints / f"checkpoint-{info['global_step']}" / "trainer_state.json").is_file()


@pytest.mark.slow
def test_site_fine_tuning_continues_an_adapter_on_mixed_data(
    tiny_value_miner_run, tiny_model_dir, sft_export_dir, tmp_path
):
    from tests.fixtures.sft import SPLITS, write_export

    site = write_export(
        tmp_path / "site",
        {
            "train": {"trials": ["NCT0005"], "pairs": [("P3", "NCT0005")]},
            "validation": SPLITS["validation"],
            "test": SPLITS["test"],
        },
    )
    public_adapter = RunDir(tiny_value_miner_run).adapter
    sets = [
        f"init_adapter={public_adapter}",
        "max_steps=3",
        f"datasets=[{{path: {sft_export_dir / 'value_miner'}, weight: 0.5}}, "
        f"{{path: {site / 'value_miner'}, weight: 2}}]",
    ]
    with pytest.raises(TrainError, match="init_adapter has LoRA r=32, .* asks for r=8"):
        prepare(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path, *sets, "lora={r: 8}"))
    result = train(tiny_cfg(tiny_model_dir, sft_export_dir / "value_miner", tmp_path, *sets))
    info = RunDir(result.run_dir).read_info()
    assert info["train_records"] == 4 + 2 * 2
    assert [(d["weight"], d["train_records"]) for d in info["datasets"]] == [(0.5, 8), (2.0, 2)]
    from safetensors.torch import load_file

    before = load_file(public_adapter / "adapter_model.safetensors")
    after = load_file(result.adapter_dir / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    # continued from the public adapter: close to it after 3 small steps, but moved
    diffs = [float((after[k] - before[k]).abs().max()) for k in before]
    assert 0 < max(diffs) < 0.5
    assert "initialized from adapter" in (result.adapter_dir / "README.md").read_text()


def test_a_continued_run_records_the_adapters_lora_settings_and_trains_again_from_its_config(
    tiny_model_dir, sft_export_dir, tmp_path
):
    """A run that continues an adapter without 'lora' settings trains that adapter as it is: its
    config.yaml says so (not the defaults), and prepares the same run again as given."""
    from verdict.train.sft_trainer import open_for_training

    adapter = tmp_path / "adapter"  # a site's adapter, LoRA settings other than the defaults
    adapter.mkdir()
    lora = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": ["v_proj", "q_proj", "up_proj"]}
    (adapter / "adapter_config.json").write_text(json.dumps(lora))
    cfg = tiny_cfg(
        tiny_model_dir, sft_export_dir / "value_miner", tmp_path / "runs", f"init_adapter={adapter}"
    )
    run, state = open_for_training(prepare(cfg), overwrite=False)
    assert state == "new"
    recorded = load_train_config(run.config)
    assert recorded.lora.model_dump() == {"r": 16, "alpha": 32, "dropout": 0.0,
                                          "target_modules": ["q_proj", "up_proj", "v_proj"]}  # fmt: skip
    again = prepare(recorded.model_copy(update={"output_dir": str(tmp_path / "again")}))
    assert again.cfg.lora == recorded.lora
    assert open_for_training(prepare(cfg), overwrite=False)[1] == "resume"  # the same run, not "different"


@pytest.mark.slow  # trains the tiny student once per session (about 20 s)
def test_merge_gives_the_same_greedy_output(tiny_value_miner_run, sft_export_dir, tmp_path):
    from verdict.train.generation import Generator

    run = RunDir(tiny_value_miner_run)
    base = TrainConfig.model_validate(run.read_config()).base_model
    dest = merge(run.path, tmp_path / "merged", progress=lambda m: None)
    assert (dest / "config.json").is_file() and not (dest / "adapter_config.json").exists()
    from datasets import load_from_disk

    msgs = [load_from_disk(str(sft_export_dir / "value_miner"))["train"][i]["messages"] for i in range(3)]
    with_adapter = Generator(base, str(run.adapter), device="cpu", max_new_tokens=64).generate(msgs)
    merged = Generator(str(dest), None, device="cpu", max_new_tokens=64).generate(msgs)
    assert [g.text for g in merged] == [g.text for g in with_adapter]
    assert [g.text for g in merged] == [m[2]["content"] for m in msgs]


def test_a_marked_copy_of_the_template_can_be_given_for_training(tiny_model_dir, sft_export_dir, tmp_path):
    from transformers import AutoTokenizer

    base = tmp_path / "chatml-base"
    shutil.copytree(tiny_model_dir, base)
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = CHATML_WITHOUT_MARKERS
    tok.save_pretrained(base)
    marked = tmp_path / "marked.jinja"
    marked.write_text(
        "{% for message in messages %}{% if message['role'] == 'assistant' %}"
        "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>\\n' }}"
        "{% endgeneration %}{% else %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    cfg = tiny_cfg(base, sft_export_dir / "value_miner", tmp_path, f"training_chat_template={marked}")
    prep = prepare(cfg)
    assert prep.tokenizer.chat_template == marked.read_text() and prep.training_template is None
    assert prep.inference_template == CHATML_WITHOUT_MARKERS  # what the adapter will ship
    trainer = build_trainer(prep, RunDir(tmp_path / "run"), callbacks=[])
    b = trainer.data_collator([trainer.train_dataset[0]])
    first = (b["labels"][0] != -100).tolist().index(True)
    assert prep.tokenizer.decode(b["input_ids"][0][first:]) == prep.train_set[0]["messages"][2]["content"] + (
        "<|im_end|>\n"
    )

    different = tmp_path / "different.jinja"
    different.write_text(
        marked.read_text().replace("<|im_end|>\\n' }}{% endgeneration", "' }}{% endgeneration")
    )
    with pytest.raises(TrainError, match="renders conversations differently"):
        prepare(
            tiny_cfg(base, sft_export_dir / "value_miner", tmp_path, f"training_chat_template={different}")
        )
    with pytest.raises(TrainError, match="has no \\{% generation %\\} markers"):
        prepare(
            tiny_cfg(
                base,
                sft_export_dir / "value_miner",
                tmp_path,
                f"training_chat_template={tmp_path / 'chatml-base' / 'chat_template.jinja'}",
            )
        )
