"""The CI site dry run (docs/deploy.md): the README's GPU steps as a site follows them, with the tiny
student for the 7B and a device override (`--set vllm.device=cpu`), from the train configs to `verdict
serve up`, through the SLURM render, asserting that every path a step reads is the path the step
before it wrote.

The site keeps its own config folder (copies of the shipped train and serve configs, edited as
docs/deploy.md says: the base model, the serve config's `root`), runs every command from its install
prefix through `verdict --config-dir`, trains each student for one step (the chain, not the model, is
under test) and serves them on vLLM CPU. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from verdict.serve.vllm.server import free_port

from tests.fixtures.vllm import vllm_available, vllm_python
from tests.serve.conftest import verdict_command
from tests.support import REPO, need

TASKS = ("parser", "value_miner")


def run(site: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """A command as the site runs it: from its prefix, with its config folder."""
    cmd = [*verdict_command(), "--config-dir", str(site / "etc"), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=site, timeout=timeout)
    assert r.returncode == 0, f"{shlex.join(args)}:\n{r.stderr[-3000:]}"
    return r


def site_folder(tmp_path: Path, base_model: Path, export: Path) -> Path:
    """The site's install prefix: its config folder (shipped configs, edited) and the teacher export."""
    site = tmp_path / "site"
    for kind in ("train", "serve", "slurm"):
        (site / "etc" / kind).mkdir(parents=True)
    for task in TASKS:
        cfg = yaml.safe_load((REPO / "configs" / "train" / f"{task}.yaml").read_text())
        cfg["base_model"] = str(base_model)  # "point configs/train/*.yaml at your local copy"
        (site / "etc" / "train" / f"{task}.yaml").write_text(yaml.safe_dump(cfg))
        # `verdict teacher export --out data/sft` writes data/sft/<task>: the tiny students' export
        shutil.copytree(export / task, site / "data" / "sft" / task)
    serve = yaml.safe_load((REPO / "configs" / "serve" / "gpu-qwen7b.yaml").read_text())
    serve["root"] = str(site)  # the site's install prefix
    serve["vllm"]["model"] = str(base_model)
    (site / "etc" / "serve" / "site.yaml").write_text(yaml.safe_dump(serve))
    shutil.copy(REPO / "configs" / "slurm" / "default.yaml", site / "etc" / "slurm" / "site.yaml")
    return site


@pytest.mark.slow
@pytest.mark.vllm
def test_site_dry_run_from_train_configs_to_serve_up(tmp_path, student_base_dir, student_export_dir):
    need(vllm_available(), f"vLLM environment missing ({vllm_python()})")
    site = site_folder(tmp_path, student_base_dir, student_export_dir)
    one_step_on_cpu = ["--set", "max_steps=1", "--set", "device=cpu", "--set", "bf16=false"]
    written: dict[str, Path] = {}
    for task in TASKS:
        check = json.loads(run(site, "train", "--config", task, "--check", *one_step_on_cpu).stdout)
        assert [d["path"] for d in check["datasets"]] == [str(site / "data" / "sft" / task)]
        out = json.loads(run(site, "train", "--config", task, *one_step_on_cpu).stdout)
        assert out["status"] == "completed"
        written[task] = Path(out["run_dir"])
        assert written[task] == site / "runs" / "students" / task

    # SLURM: the train job of the same config writes the same run folder; the serve job finds the config
    logs = ["--set", f"log_dir={site / 'slurm-logs'}"]
    chain = json.loads(
        run(site, "slurm", "render", "--train", "parser", "--slurm", "site", *logs, *(
            x for s in one_step_on_cpu[1::2] for x in ("--set-train", s)
        )).stdout
    )  # fmt: skip
    assert Path(chain["run_dir"]) == written["parser"]
    train_line = Path(chain["train"]).read_text().strip().splitlines()[-1]
    assert f"--config {site / 'etc' / 'train' / 'parser.yaml'}" in train_line
    assert f"#SBATCH --chdir={site}" in Path(chain["train"]).read_text()
    job = run(site, "serve", "slurm-job", "--config", "site", "--slurm", "site", "--set-slurm", logs[1],
              "--set", f"vllm.python={vllm_python()}", "--out", str(site / "slurm-jobs"))  # fmt: skip
    serve_line = Path(job.stdout.strip()).read_text().strip().splitlines()[-1]
    assert (
        f"--config-dir {site / 'etc'} serve vllm --config {site / 'etc' / 'serve' / 'site.yaml'}"
        in serve_line
    )

    # the serve config reads the training runs; vLLM is started on their adapters
    port = free_port()
    overrides = [
        *("--set", "vllm.device=cpu", "--set", "vllm.dtype=float32", "--set", "limits=cpu-tiny"),
        *("--set", f"vllm.python={vllm_python()}", "--set", f"vllm.port={port}", "--set", "api.port=0"),
        *("--set", f"api.formalizer.base_url=http://127.0.0.1:{port}/v1"),
    ]
    command = run(site, "serve", "vllm", "--config", "site", *overrides, "--print-command").stdout
    words = shlex.split(command)
    lora = words[words.index("--lora-modules") + 1 : words.index("--lora-modules") + 3]
    assert lora == [f"{t}={written[t] / 'adapter'}" for t in TASKS]
    key = run(site, "serve", "keys", "add", "--config", "site", "--name", "dry-run", "--role", "match")
    ready = site / "ready.json"
    proc = subprocess.Popen(
        [
            *verdict_command(),
            "--config-dir",
            str(site / "etc"),
            "serve",
            "up",
            "--config",
            "site",
            *overrides,
            "--init",
            "--ready-file",
            str(ready),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip  (started from outside the prefix: the config's root decides the paths)
    try:
        deadline = time.monotonic() + 600
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "not ready in time"
            time.sleep(0.5)
        url = json.loads(ready.read_text())["url"]
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as c:
            deadline = time.monotonic() + 300
            while c.get("/readyz").status_code != 200:  # grammar warm-up
                assert time.monotonic() < deadline
                time.sleep(1)
            r = c.get("/v1/trials/none", headers={"Authorization": f"Bearer {key.stdout.strip()}"})
            assert r.status_code == 404  # the key `keys add` wrote is the one the service reads
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "matching API at" in err and "/docs" not in err  # no link to a page the service does not serve
    for line in (
        f"audit store: {site / 'runs' / 'serve' / 'audit.sqlite'}",
        f"API keys: {site / 'runs' / 'serve' / 'api_keys.json'}",
        f"serve config: {site / 'etc' / 'serve' / 'site.yaml'}",
    ):
        assert line in err
    assert (site / "runs" / "serve" / "audit.sqlite").is_file() and not (tmp_path / "runs").exists()
