"""Every path a shipped train, slurm, serve and recipe config reads is one the step before it writes
(docs/deploy.md, "Paths"), and `verdict serve slurm-job` renders a job that finds its config."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from verdict.bench.recipe import Layout, bench_config_data, steps
from verdict.bench.recipe_config import load_recipe
from verdict.core.configs import find_config
from verdict.serve.config import load_serve_config
from verdict.serve.preflight import PreflightError
from verdict.serve.vllm.slurm_job import render_serve_job
from verdict.slurm.job_config import load_slurm_config
from verdict.slurm.render import render_train_chain
from verdict.train.sft_config import TASKS, load_train_config

from tests.serve.test_site_paths import training_run
from tests.support import REPO
from verdict.demo import student_overrides

EXPORT_OUT = "data/sft"  # `verdict teacher export --out data/sft` writes data/sft/<task> (docs/deploy.md)


def test_shipped_train_slurm_and_serve_configs_chain(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # train configs take paths from where `verdict train` runs: the checkout
    serve = load_serve_config("gpu-qwen7b")
    slurm = load_slurm_config(find_config("slurm", "default"), [f"log_dir={tmp_path / 'logs'}"])
    for task in TASKS:
        train = load_train_config(find_config("train", task))
        assert [d.path for d in train.datasets] == [f"{EXPORT_OUT}/{task}"]
        written = (REPO / train.run_dir).resolve()
        assert serve.vllm.adapters[task] == str(written)  # serve reads the run folder training writes
        assert serve.vllm.model == str((REPO / train.base_model).resolve())
        # the SLURM train job runs the same config in the checkout: the same run folder
        chain = render_train_chain(slurm, task, tmp_path / task)
        assert chain.run_dir.resolve() == written
        cmd = shlex.split(chain.train.read_text().strip().splitlines()[-1])
        assert cmd[1:5] == ["verdict", "train", "--config", str(find_config("train", task).resolve())]
        assert f"#SBATCH --chdir={REPO}" in chain.train.read_text()


def test_the_demo_writes_what_cpu_tiny_reads(monkeypatch):
    monkeypatch.chdir(REPO)
    shipped = load_serve_config("cpu-tiny")
    demo = load_serve_config("cpu-tiny", student_overrides(Path("runs/demo")))
    assert (shipped.vllm.model, shipped.vllm.adapters) == (demo.vllm.model, demo.vllm.adapters)
    assert shipped.vllm.adapters["parser"] == str(REPO / "runs" / "demo" / "tiny-parser")


def test_the_recipe_reads_the_runs_its_train_steps_write():
    recipe = load_recipe("qwen2.5-7b-trec2021")
    lay = Layout(recipe.root, recipe.name)
    reads = bench_config_data(recipe, lay)["vllm"]["adapters"]
    for step in steps(recipe):
        if step.name.startswith("train-"):
            sets = dict(x.split("=", 1) for x in step.command[step.command.index("--set") + 1 :: 2])
            task = step.name.removeprefix("train-")
            assert reads[task] == str(Path(sets["output_dir"]) / sets["name"])


def test_slurm_job_finds_its_config_and_checks_inputs_before_rendering(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "serve").mkdir(parents=True)
    (site / "serve" / "site.yaml").write_text(
        (REPO / "configs" / "serve" / "gpu-qwen7b.yaml")
        .read_text()
        .replace("root: ../..", f"root: {tmp_path}")
    )
    monkeypatch.setenv("VERDICT_CONFIG_DIR", str(site))
    slurm = load_slurm_config(find_config("slurm", "default"), [f"log_dir={tmp_path / 'logs'}"])
    with pytest.raises(PreflightError) as e:
        render_serve_job("site", slurm, tmp_path / "jobs")
    model = tmp_path.parent / "models" / "Qwen2.5-7B-Instruct"  # ../models from the root
    assert f"base model folder {model} does not exist" in str(e.value)
    assert f"adapter folder {tmp_path / 'runs' / 'students' / 'parser'} does not exist" in str(e.value)
    assert not (tmp_path / "jobs").exists()
    # inputs there: the job names the config file, carries the config folder, binds to the node
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    for task in TASKS:
        training_run(tmp_path / "runs" / "students" / task)
    script, reach = render_serve_job("site", slurm, tmp_path / "jobs", overrides=["vllm.python=/bin/true"])
    line = script.read_text().strip().splitlines()[-1]
    words = shlex.split(line.replace('"vllm.host=$(hostname -f)"', "vllm.host=NODE"))
    assert words[:8] == [
        "exec",
        "verdict",
        "--config-dir",
        str(site),
        "serve",
        "vllm",
        "--config",
        str(site / "serve" / "site.yaml"),
    ]
    assert words[-2:] == ["--set", "vllm.host=NODE"] and "http://NODE:8011/v1" in reach
