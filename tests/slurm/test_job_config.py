"""Cluster configs (verdict.slurm.job_config): shipped configs load, bad values are refused by name."""

import pytest
from verdict.core.configs import ConfigError
from verdict.slurm.job_config import load_slurm_config

from tests.support import REPO

SLURM = REPO / "configs" / "slurm"


def test_shipped_configs_are_single_gpu_jobs_with_limits():
    default = load_slurm_config(SLURM / "default.yaml")
    for kind in ("train", "eval", "serve"):
        job = getattr(default.jobs, kind)
        assert job.gpus == 1 and job.time and job.mem
    assert default.jobs.train.time == "10:00:00"  # the paper's longest job limit
    assert default.jobs.eval_report.gpus == 0
    local = load_slurm_config(SLURM / "local.yaml")
    assert local.jobs.eval.shards == 2 and local.jobs.train.cpus == 1


@pytest.mark.parametrize(
    "override, message",
    [
        ("jobs.train.time=ten hours", "jobs.train.time: Value error, 'ten hours' is not an sbatch time"),
        ("jobs.eval.mem=lots", "jobs.eval.mem: Value error, 'lots' is not an sbatch memory size"),
        ("jobs.train.gpus=2", "jobs.train.gpus: Input should be less than or equal to 1"),
        ("jobs.trian.time=1:00:00", "unknown config key 'jobs.trian' (did you mean 'train'?)"),
        ("env={1BAD: x}", "'1BAD' is not a valid environment variable name"),
        ("extra_sbatch=[constraint]", "must be one sbatch option"),
    ],
)
def test_bad_values_are_refused(override, message):
    with pytest.raises(ConfigError) as e:
        load_slurm_config(SLURM / "default.yaml", [override])
    assert message in str(e.value)


def test_sbatch_time_formats_are_accepted():
    for t in ("30", "10:00", "10:00:00", "1-00", "1-00:00", "7-00:00:00"):
        assert load_slurm_config(SLURM / "default.yaml", [f"jobs.serve.time={t}"]).jobs.serve.time == t


def test_unquoted_times_stay_sbatch_times(tmp_path):
    # YAML 1.1 reads 10:00:00 as the base-60 number 36000; the config loader does not
    f = tmp_path / "c.yaml"
    f.write_text("jobs:\n  train: {time: 10:00:00, mem: 64G}\n  eval: {time: 30, mem: 4000}\n")
    cfg = load_slurm_config(f, ["jobs.serve.time=2:00:00", "jobs.serve.mem=8G"])
    assert (cfg.jobs.train.time, cfg.jobs.eval.time, cfg.jobs.eval.mem) == ("10:00:00", "30", "4000")
    assert cfg.jobs.serve.time == "2:00:00"
