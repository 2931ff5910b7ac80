"""The local one-node cluster (verdict.slurm.local_cluster): GPU GRES, PIDs, stopping by PID."""

import os
import shutil
import subprocess
import tempfile
import time

import pytest
from verdict.slurm.submit import wait_for


@pytest.mark.slurm
def test_gpu_jobs_get_a_device_and_logs_follow_the_pattern(slurm_cluster, tmp_path):
    script = tmp_path / "gpu.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --job-name=probe\n#SBATCH --output={tmp_path}/%x-%j.out\n"
        "#SBATCH --gres=gpu:1\n#SBATCH --mem=100M\n#SBATCH --time=2\n"
        "echo visible=$CUDA_VISIBLE_DEVICES\n"
    )
    out = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        env=slurm_cluster.env(),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert wait_for([job], timeout=120, env=slurm_cluster.env()) == {job: "COMPLETED"}
    assert (tmp_path / f"probe-{job}.out").read_text().strip() in ("visible=0", "visible=1")


@pytest.mark.slurm
def test_a_cluster_is_stopped_by_its_recorded_pids(slurm_cluster):
    from verdict.slurm.local_cluster import LocalCluster

    # a second, independent cluster (free ports, own folder): cheap to start, then stopped
    root = tempfile.mkdtemp(prefix="vslurm2-")
    c = LocalCluster(root, gpus=1).start()
    pids = c.pids()
    try:
        _check_stopped_by_pid(c, pids, root)
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert slurm_cluster.running()  # the session's cluster is untouched


def _check_stopped_by_pid(c, pids, root):
    assert set(pids) == {"slurmctld", "slurmd"} and c.running()
    assert "nvidia0" in os.listdir(os.path.join(root, "dev"))
    c.stop()
    assert not c.pids()
    for pid in pids.values():
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and os.path.exists(f"/proc/{pid}")
            and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
        ):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
