"""`verdict train ...`: bad input gives 'error: ...' and exit 2, never a traceback."""

import json

import pytest

from tests.support import run_verdict

verdict = run_verdict


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "--config", "parser", "--set", "learning_rate=1"],
            "error: unknown config key 'learning_rate' (known keys: assistant_only_loss, base_model,",
        ),
        (["train", "--config", "parser", "--set", "lora.rank=8"], "error: unknown config key 'lora.rank'"),
        (["train", "--config", "no-such-config"], "error: no train config named 'no-such-config'"),
        (["train", "--config", "parser"], "error: base_model '"),
        (["train", "eval", "--run", "no/such/run"], "error: run directory 'no/such/run' does not exist"),
    ],
)
def test_errors_are_one_line_messages(args, message):
    out = verdict(*args)
    assert out.returncode == 2
    assert out.stderr.startswith(message), out.stderr
    assert "Traceback" not in out.stderr


def test_check_reports_what_would_be_trained(tiny_model_dir, sft_export_dir, tmp_path):
    out = verdict(
        "train",
        "--config",
        "value_miner",
        "--check",
        "--set",
        f"base_model={tiny_model_dir}",
        "--set",
        f"datasets=[{{path: {sft_export_dir / 'value_miner'}}}]",
        "--set",
        "bf16=false",
        "--set",
        f"output_dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["ok"] and info["train_records"] == 8 and info["eval_records"] == 2
    assert info["training_template"] == "TRL training variant"
    assert not (tmp_path / "value_miner").exists()  # a check writes nothing


def test_wrong_task_dataset_is_refused_by_the_cli(tiny_model_dir, sft_export_dir, tmp_path):
    out = verdict(
        "train",
        "--config",
        "value_miner",
        "--set",
        f"base_model={tiny_model_dir}",
        "--set",
        f"datasets=[{{path: {sft_export_dir / 'parser'}}}]",
        "--set",
        "bf16=false",
        "--set",
        f"output_dir={tmp_path}",
    )
    assert out.returncode == 2 and "is a 'parser' dataset" in out.stderr and "Traceback" not in out.stderr
