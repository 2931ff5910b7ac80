"""Rendering job scripts (verdict.slurm.render): literal #SBATCH values, chains, arrays, serve jobs."""

import re
import shlex
import subprocess

import pytest
from verdict.core.configs import ConfigError
from verdict.slurm.job_config import load_slurm_config
from verdict.slurm.render import RenderError, render_job, render_train_chain

from tests.support import REPO

SLURM = REPO / "configs" / "slurm"
TRAIN = REPO / "configs" / "train" / "value_miner.yaml"


def sbatch_lines(path):
    return [line for line in path.read_text().splitlines() if line.startswith("#SBATCH")]


def test_chain_scripts_have_every_value_rendered_in(tmp_path):
    slurm = load_slurm_config(
        SLURM / "default.yaml",
        [
            f"log_dir={tmp_path / 'logs'}",
            "partition=gpu",
            "account=trials",
            "extra_sbatch=[--constraint=a6000]",
        ],
    )
    s = render_train_chain(slurm, TRAIN, tmp_path / "jobs", [f"output_dir={tmp_path / 'runs'}", "lr=1e-4"])
    assert s.eval_report is None and s.shards == 1
    train = sbatch_lines(s.train)
    for line in train:
        assert "$" not in line  # sbatch would not expand it
    assert f"#SBATCH --output={tmp_path / 'logs'}/%x-%j.out" in train
    assert (tmp_path / "logs").is_dir()  # slurm does not create it: the renderer does, once for all parts
    assert "#SBATCH --job-name=verdict-train-value_miner" in train
    assert {
        "#SBATCH --gres=gpu:1",
        "#SBATCH --time=10:00:00",
        "#SBATCH --mem=64G",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=trials",
        "#SBATCH --constraint=a6000",
        "#SBATCH --signal=B:TERM@300",
        f"#SBATCH --chdir={REPO}",
    } <= set(train)
    assert not any("--array" in line for line in train)
    text = s.train.read_text()
    assert "export HF_HUB_OFFLINE=1" in text and "source .venv/bin/activate" in text
    cmd = shlex.split(text.strip().splitlines()[-1])
    assert cmd[:5] == ["exec", "verdict", "train", "--config", str(TRAIN)]
    assert cmd[5:] == ["--set", f"output_dir={tmp_path / 'runs'}", "--set", "lr=1e-4"]
    ev = s.eval.read_text().strip().splitlines()[-1]
    assert ev.startswith(f"exec verdict train eval --run {tmp_path / 'runs' / 'value_miner'} --split test")
    for script in (s.train, s.eval):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_sharded_eval_is_an_array_followed_by_a_report_job(tmp_path):
    slurm = load_slurm_config(SLURM / "default.yaml", ["jobs.eval.shards=4"])
    s = render_train_chain(slurm, TRAIN, tmp_path, [f"output_dir={tmp_path}"], split="validation")
    assert "#SBATCH --array=0-3" in sbatch_lines(s.eval)
    ev = s.eval.read_text()
    assert (
        '--num-shards 4 --shard "${SLURM_ARRAY_TASK_ID:-0}" --no-report' in ev and "--split validation" in ev
    )
    report = s.eval_report.read_text()
    assert "--report-only" in report and "--array" not in report
    assert "#SBATCH --gres" not in report  # scoring runs the Z3 core: no GPU
    assert "#SBATCH --job-name=verdict-eval-report-value_miner" in report


def test_default_script_folder_is_beside_the_run_directory(tmp_path):
    s = render_train_chain(load_slurm_config(SLURM / "local.yaml"), TRAIN, None, [f"output_dir={tmp_path}"])
    assert s.train.parent == tmp_path / "value_miner.slurm" and s.run_dir == tmp_path / "value_miner"
    assert not s.run_dir.exists()  # the run directory belongs to the trainer


def test_bad_train_keys_are_refused_before_anything_is_written(tmp_path):
    slurm = load_slurm_config(SLURM / "default.yaml")
    with pytest.raises(ConfigError, match="unknown config key 'epoch' \\(did you mean 'epochs'\\?\\)"):
        render_train_chain(slurm, TRAIN, tmp_path / "jobs", ["epoch=2"])
    with pytest.raises(ConfigError, match="unknown config key 'beam_size'"):
        render_train_chain(slurm, TRAIN, tmp_path / "jobs", eval_overrides=["beam_size=4"])
    assert not (tmp_path / "jobs").exists()


def test_serve_job_from_a_generic_command(tmp_path):
    slurm = load_slurm_config(SLURM / "default.yaml")
    path = render_job(
        "serve", slurm, "students", ["verdict", "serve", "vllm", "--config", "/site/serve.yaml"], tmp_path
    )
    lines = sbatch_lines(path)
    assert "#SBATCH --gres=gpu:1" in lines and "#SBATCH --time=7-00:00:00" in lines
    assert "#SBATCH --job-name=verdict-serve-students" in lines
    assert path.read_text().strip().endswith("exec verdict serve vllm --config /site/serve.yaml")
    with pytest.raises(RenderError, match="unknown job kind 'deploy'"):
        render_job("deploy", slurm, "x", "true", tmp_path)
    with pytest.raises(RenderError, match="may only use letters"):
        render_job("serve", slurm, "two words", "true", tmp_path)
    with pytest.raises(RenderError, match="one line"):
        render_job("serve", slurm, "x", "a\nb", tmp_path)


def test_cli_render_prints_the_scripts(tmp_path):
    import json
    import sys

    cli = [sys.executable, "-c", "from verdict.cli import main; main()"]
    value_miner_on = [*cli, "slurm", "render", "--train", "value_miner", "--slurm"]
    render = [
        *value_miner_on,
        "local",
        "--set-train",
        f"output_dir={tmp_path}",
        "--set-train",
        f"base_model={tmp_path / 'no-model'}",
        "--out",
        str(tmp_path / "jobs"),
    ]
    # the checks of `verdict train --check` run first: a missing base model is refused, nothing written
    out = subprocess.run(render, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"base_model '{tmp_path / 'no-model'}'" in out.stderr and not (tmp_path / "jobs").exists()
    out = subprocess.run([*render, "--no-check"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["eval_shards"] == 2 and re.search(r"eval_report\.sbatch$", info["eval_report"])
    bad = subprocess.run([*value_miner_on, "nope"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no slurm config named 'nope'")
