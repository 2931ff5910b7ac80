"""On a real SLURM cluster: the rendered train -> eval chain of a tiny student (verdict.slurm.submit)."""

import json
import subprocess
import sys

import pytest
from verdict.train.run_dir import RunDir

from tests.fixtures.sft import TINY_OVERRIDES
from tests.support import REPO


def verdict(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "verdict", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=1500,
    )


@pytest.mark.slow
@pytest.mark.slurm
def test_train_then_sharded_eval_chain_completes(slurm_cluster, tiny_model_dir, sft_export_dir, tmp_path):
    train_sets = TINY_OVERRIDES + [
        f"base_model={tiny_model_dir}",
        f"datasets=[{{path: {sft_export_dir / 'value_miner'}}}]",
        f"output_dir={tmp_path / 'runs'}",
        "name=ci-vm",
    ]
    args = [
        "slurm",
        "submit",
        "--train",
        "value_miner",
        "--slurm",
        "local",
        "--wait",
        "--timeout",
        "1200",
        "--set",
        f"workdir={REPO}",
        "--set",
        f"log_dir={tmp_path / 'logs'}",
        "--set-eval",
        "max_new_tokens=128",
        "--set-eval",
        "batch_size=8",
    ]
    for s in train_sets:
        args += ["--set-train", s]
    out = verdict(*args, env=slurm_cluster.env())
    logs = sorted((tmp_path / "logs").glob("*.out")) if (tmp_path / "logs").exists() else []
    tails = "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in logs)
    assert out.returncode == 0, f"{out.stderr[-3000:]}\n{tails}"
    lines = out.stdout.strip().splitlines()
    submitted = json.loads("\n".join(lines[:-1]))
    ids = submitted["jobs"]
    assert set(ids) == {"train", "eval", "eval_report"} and len(set(ids.values())) == 3
    assert json.loads(lines[-1])["states"] == {
        ids["train"]: "COMPLETED",
        ids["eval"]: "COMPLETED",
        ids["eval_report"]: "COMPLETED",
    }

    run = RunDir(tmp_path / "runs" / "ci-vm")
    assert (run.adapter / "adapter_model.safetensors").is_file() and run.read_info()["status"] == "completed"
    report_dir = run.eval_dir("public/value_miner", "test")
    assert {"predictions.shard-0-of-2.jsonl", "predictions.shard-1-of-2.jsonl"} <= {
        p.name for p in report_dir.iterdir()
    }
    report = json.loads((report_dir / "report.json").read_text())
    assert report["records"] == 4 and report["decisions"]["available"]

    # %x-%j logs; the train job saw its (fake) GPU
    names = {p.name for p in logs}
    assert f"verdict-train-ci-vm-{ids['train']}.out" in names
    assert f"verdict-eval-report-ci-vm-{ids['eval_report']}.out" in names
    assert sum(n.startswith("verdict-eval-ci-vm-") for n in names) == 2  # one log per array task
    train_log = (tmp_path / "logs" / f"verdict-train-ci-vm-{ids['train']}.out").read_text()
    assert "GPUs: 0" in train_log or "GPUs: 1" in train_log
    assert "done: 60 steps" in train_log


@pytest.mark.slurm
def test_eval_never_runs_after_a_failed_train(slurm_cluster, tmp_path):
    from verdict.slurm.job_config import load_slurm_config
    from verdict.slurm.render import render_train_chain
    from verdict.slurm.submit import submit_chain, wait_for

    slurm = load_slurm_config(
        REPO / "configs" / "slurm" / "local.yaml",
        [f"workdir={REPO}", f"log_dir={tmp_path / 'logs'}", "jobs.eval.shards=1"],
    )
    scripts = render_train_chain(
        slurm,
        "value_miner",
        tmp_path / "jobs",
        [
            f"base_model={tmp_path / 'missing-model'}",
            f"output_dir={tmp_path / 'runs'}",
            "bf16=false",
            "name=doomed",
        ],
    )
    env = slurm_cluster.env()
    ids = submit_chain(scripts, env=env)
    try:
        states = wait_for(ids.values(), timeout=300, env=env)
    finally:
        subprocess.run(["scancel", *ids.values()], env=env, capture_output=True)
    assert states == {ids["train"]: "FAILED", ids["eval"]: "NEVER_RUNS"}
    log = (tmp_path / "logs" / f"verdict-train-doomed-{ids['train']}.out").read_text()
    assert "error: base_model '" in log and "Traceback" not in log


def test_overall_state_of_a_job_or_array():
    from verdict.slurm.submit import overall

    assert overall([]) == "UNKNOWN"
    assert overall(["COMPLETED", "COMPLETED"]) == "COMPLETED"
    assert overall(["COMPLETED", "RUNNING"]) == "RUNNING"
    assert overall(["PENDING", "PENDING"]) == "PENDING"
    assert overall(["COMPLETED", "FAILED"]) == "FAILED"  # one failed array task fails the array
    assert overall(["NEVER_RUNS"]) == "NEVER_RUNS"


def test_a_job_depending_on_one_not_submitted_before_it_is_refused_before_any_sbatch(tmp_path):
    from verdict.slurm.submit import Job, SubmitError, submit_jobs

    with pytest.raises(SubmitError, match="'report' depends on eval, not submitted before it"):
        submit_jobs(
            [Job("report", tmp_path / "report.sbatch", after=["eval"]), Job("eval", tmp_path / "e.sbatch")]
        )
