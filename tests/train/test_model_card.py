"""The model card written next to every adapter (verdict.train.model_card)."""

import yaml
from verdict.train.model_card import render_model_card
from verdict.train.sft_config import TrainConfig


def test_card_has_front_matter_data_recipe_results_and_provenance():
    cfg = TrainConfig(
        name="site-parser",
        task="parser",
        base_model="/models/Qwen2.5-7B-Instruct",
        datasets=[{"path": "/d/public/parser"}],
        init_adapter="/runs/parser/adapter",
    )
    info = {
        "datasets": [
            {
                "label": "public/parser",
                "weight": 0.5,
                "train_records": 120,
                "fingerprint": "sha256:" + "ab" * 32,
            }
        ],
        "train_records": 60,
        "dropped_overlong": 2,
        "metrics": {"train_loss": 0.25, "global_step": 30},
        "code_version": "git:abc123",
        "libraries": {"trl": "1.16.0", "peft": "0.21.2"},
    }
    card = render_model_card(cfg, info)
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "peft" and front["base_model"] == "/models/Qwen2.5-7B-Instruct"
    assert "verdict-parser" in front["tags"]
    assert "| public/parser | 0.5 | 120 | `sha256:abababababababab` |" in card
    assert "dropped as longer than 4096 tokens: 2" in card
    assert "LoRA r=32, alpha=64, dropout=0.05 on q_proj, k_proj, v_proj, o_proj" in card
    assert "lr 0.0002 (linear, warmup ratio 0.05), 3 epochs, batch 2 x 8 accumulation" in card
    assert "initialized from adapter: /runs/parser/adapter" in card
    assert "- train_loss: 0.25" in card and "- global_step: 30" in card
    assert "code: git:abc123" in card and "peft 0.21.2, trl 1.16.0" in card
