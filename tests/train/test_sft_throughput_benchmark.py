"""benchmarks/sft_throughput.py runs (tiny CPU flag); the GPU figures come from a site's run."""

import json
import subprocess
import sys

from tests.support import REPO


def test_benchmark_runs_on_cpu_with_tiny_flag(tmp_path, sft_export_dir, tiny_model_dir):
    out = subprocess.run(
        [
            sys.executable,
            "benchmarks/sft_throughput.py",
            "--tiny",
            "--steps",
            "2",
            "--records",
            "1000",
            "--mean-tokens",
            "2000",
            "--dataset",
            str(sft_export_dir / "parser"),
            "--tokenizer",
            str(tiny_model_dir),
            "--json",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["tokens_per_second"] > 0 and r["seconds_per_step"] > 0 and r["activation_checkpointing"]
    assert r["lora"] == {
        "r": 32,
        "alpha": 64,
        "dropout": 0.05,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    by_name = {p["dataset"]: p for p in r["projections"]}
    assert by_name["1000 records x 2000 tokens"]["hours"] == round(
        3 * 2_000_000 / r["tokens_per_second"] / 3600, 2
    )
    exported = by_name[f"{sft_export_dir / 'parser'} (train split)"]
    assert exported["records"] == 4 and exported["tokens_per_epoch"] > 0
    assert "tokens/s" in out.stdout


def test_architecture_is_qwen2_5_7b_instruct():
    sys.path.insert(0, str(REPO))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmarks.sft_throughput import QWEN2_5_7B_INSTRUCT

    with torch.device("meta"):  # no memory: shapes only
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_5_7B_INSTRUCT))
    n = sum(p.numel() for p in model.parameters())
    assert 7.60e9 < n < 7.63e9  # 7.62B, the published size
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.shape == (512, 3584) and attn.q_proj.bias is not None  # GQA 28/4, QKV bias
