"""Strict configs with dotted command-line overrides (train.config_io)."""

import pytest

from train import config_io
from train.config_io import ConfigError
from train.sft_config import TrainConfig

BASE = {"name": "r", "task": "parser", "base_model": "m", "datasets": [{"path": "d"}]}


def test_override_sets_nested_keys_and_parses_values():
    data = config_io.apply_overrides(
        BASE, ["lr=1e-3", "lora.r=16", "bf16=false", "datasets=[{path: x, weight: 2}]"], TrainConfig
    )
    cfg = TrainConfig.model_validate(data)
    assert cfg.lr == 1e-3 and cfg.lora.r == 16 and cfg.bf16 is False
    assert cfg.lora.alpha == 64  # untouched siblings keep their defaults
    assert cfg.datasets[0].path == "x" and cfg.datasets[0].weight == 2


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("lrr=1", "unknown config key 'lrr' (did you mean 'lr'?)"),
        ("lora.rank=8", "unknown config key 'lora.rank'"),
        ("lr.x=1", "'lr' has no sub-keys"),
        ("lr", "is not KEY=VALUE"),
    ],
)
def test_bad_overrides_are_refused_by_name(item, fragment):
    with pytest.raises(ConfigError) as e:
        config_io.apply_overrides(BASE, [item], TrainConfig)
    assert fragment in str(e.value)


def test_unknown_key_in_a_file_names_the_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "task: parser\nbase_model: m\ndatasets: [{path: d}]\nlearning_rate: 1e-4\nlora: {r: 8, alfa: 3}\n"
    )
    with pytest.raises(ConfigError) as e:
        config_io.load(TrainConfig, f, ["name=x"])
    msg = str(e.value)
    assert "unknown config key 'learning_rate'" in msg
    assert "unknown config key 'lora.alfa' (did you mean 'alpha'?)" in msg


def test_bad_value_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="lr: Input should be greater than 0"):
        config_io.build(TrainConfig, BASE, ["lr=-1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config_io.read_yaml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        config_io.read_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        config_io.read_yaml(tmp_path / "list.yaml")
