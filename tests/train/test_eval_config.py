"""Eval settings (verdict.train.eval_config): the paper's decoding by default, strict keys."""

import pytest
from verdict.core.configs import ConfigError
from verdict.train.eval_config import load_eval_config

from tests.support import REPO

EVAL = REPO / "configs" / "train" / "eval.yaml"


def test_shipped_eval_config_is_the_papers_decoding():
    cfg = load_eval_config(EVAL)
    assert (cfg.batch_size, cfg.max_new_tokens, cfg.policy) == (16, 3072, "prescreen")
    assert load_eval_config(None) == cfg  # the file states the defaults


def test_unknown_and_bad_keys_are_refused():
    with pytest.raises(ConfigError, match="unknown config key 'temperature'"):
        load_eval_config(EVAL, ["temperature=0"])
    with pytest.raises(ConfigError, match="batch_size: Input should be greater than or equal to 1"):
        load_eval_config(EVAL, ["batch_size=0"])
