"""TrainConfig: the paper's recipe as defaults; shipped configs load; paths resolve."""

from pathlib import Path

import pytest
from verdict.core.configs import ConfigError
from verdict.train.sft_config import TrainConfig, load_train_config

from tests.support import REPO


def test_defaults_are_the_papers_recipe():
    cfg = TrainConfig(name="x", task="parser", base_model="m", datasets=[{"path": "d"}])
    # appendix O: LoRA r=32, alpha=64, dropout 0.05 on the attention projections; lr 2e-4, 3 epochs,
    # warmup ratio 0.05, bf16, max length 4096
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (32, 64, 0.05)
    assert cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (cfg.lr, cfg.epochs, cfg.warmup_ratio, cfg.bf16, cfg.max_length) == (2e-4, 3.0, 0.05, True, 4096)
    assert cfg.assistant_only_loss is True


@pytest.mark.parametrize("name, task", [("parser", "parser"), ("value_miner", "value_miner")])
def test_shipped_configs_load(name, task):
    cfg = load_train_config(REPO / "configs" / "train" / f"{name}.yaml")
    assert cfg.task == task and cfg.name == name  # the name defaults to the file name
    assert not Path(cfg.base_model).is_absolute()  # no machine paths in the repo
    assert cfg.datasets[0].path.endswith(task)


def test_resolved_paths_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(
        name="x", task="parser", base_model="models/base", datasets=[{"path": "d/parser"}], init_adapter="a"
    ).resolved()
    assert cfg.base_model == str(tmp_path / "models" / "base")
    assert cfg.datasets[0].path == str(tmp_path / "d" / "parser")
    assert cfg.init_adapter == str(tmp_path / "a")
    assert cfg.run_dir == tmp_path / "runs" / "students" / "x"


def test_bad_names_and_tasks_are_refused():
    with pytest.raises(ValueError, match="plain folder name"):
        TrainConfig(name="../x", task="parser", base_model="m", datasets=[{"path": "d"}])
    with pytest.raises(ConfigError, match="task: Input should be 'parser' or 'value_miner'"):
        load_train_config(REPO / "configs" / "train" / "parser.yaml", ["task=miner"])
    with pytest.raises(ConfigError, match="datasets: List should have at least 1 item"):
        load_train_config(REPO / "configs" / "train" / "parser.yaml", ["datasets=[]"])
