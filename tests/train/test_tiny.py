"""The offline tiny student (verdict.train.tiny) and `verdict train make-tiny`."""

import json
import subprocess
import sys

from tests.support import REPO


def test_make_tiny_builds_a_loadable_qwen2_with_the_official_template(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from verdict.cli import main; main()",
            "train",
            "make-tiny",
            str(tmp_path / "tiny"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    from transformers import AutoConfig, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    cfg = AutoConfig.from_pretrained(tmp_path / "tiny")
    assert (
        cfg.model_type == "qwen2" and cfg.hidden_size // cfg.num_attention_heads >= 32
    )  # vLLM CPU attention
    assert cfg.initializer_range == 0.1  # LoRA cannot learn with frozen tied embeddings at 0.02
    tok = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    assert tok.chat_template == qwen2_5_chat_template  # TRL swaps in its training variant for this one
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    size = sum(f.stat().st_size for f in (tmp_path / "tiny").iterdir())
    assert size < 5_000_000
    assert json.loads((tmp_path / "tiny" / "verdict_tiny.json").read_text())["kind"] == "tiny-qwen2-student"


def test_same_seed_same_weights(tmp_path):
    from safetensors.torch import load_file
    from verdict.train.tiny import build_tiny_student

    a = load_file(build_tiny_student(tmp_path / "a") / "model.safetensors")
    b = load_file(build_tiny_student(tmp_path / "b") / "model.safetensors")
    c = load_file(build_tiny_student(tmp_path / "c", seed=1) / "model.safetensors")
    assert all((a[k] == b[k]).all() for k in a)
    assert any((a[k] != c[k]).any() for k in a)
