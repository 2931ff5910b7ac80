"""Teacher and run configs: the shipped examples load; unknown keys and bad values are named."""

import pytest
from verdict.core.configs import available
from verdict.data_gen.formalizer.endpoint_config import load_teacher
from verdict.data_gen.formalizer.errors import ConfigError
from verdict.data_gen.teacher_config import load_run_config


@pytest.mark.parametrize("name", available("teachers"))
def test_shipped_teachers_load(name):
    t = load_teacher(name)
    assert t.name == name and t.base_url.startswith("http")


@pytest.mark.parametrize("name", available("teacher_runs"))
def test_shipped_runs_load_and_name_known_teachers(name):
    cfg = load_run_config(name)
    for stage in cfg.stages:
        load_teacher(cfg.teacher_for(stage))


def test_reasoning_model_example_omits_temperature():
    t = load_teacher("gpt-5-mini")
    assert t.temperature is None and t.max_tokens_param == "max_completion_tokens"
    assert t.extra_params == {"reasoning_effort": "minimal"}
    assert load_teacher("vllm-student-value-miner").structured_output == "vllm"


def test_unknown_key_is_named(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("name: t\nbase_url: http://127.0.0.1:1/v1\nmodel: m\ntemprature: 0.2\n")
    with pytest.raises(ConfigError) as e:
        load_teacher(p)
    assert "unknown config key 'temprature' (did you mean 'temperature'?)" in str(e.value)


@pytest.mark.parametrize(
    "body, words",
    [
        ("base_url: ftp://x/v1", ["base_url", "http(s) URL"]),
        ("base_url: http://a/v1\nextra_params: {temperature: 1}", ["temperature", "dedicated config keys"]),
        ("base_url: http://a/v1\napi: azure", ["api_version"]),
        ("base_url: http://a/v1\nmax_tokens: {parser: 0}", ["max_tokens.parser"]),
        ("base_url: http://a/v1\nmax_tokens: {parsr: 10}", ["parsr"]),
    ],
)
def test_bad_values_are_explained(tmp_path, body, words):
    p = tmp_path / "t.yaml"
    p.write_text(f"name: t\nmodel: m\n{body}\n")
    with pytest.raises(ConfigError) as e:
        load_teacher(p)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_run_config_consistency(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("name: r\nteachers: {parser: scripted, miner: scripted}\ntrials: {path: t.jsonl}\n")
    with pytest.raises(ConfigError, match="need a patients source"):
        load_run_config(p)
    p.write_text(
        "name: r\nteachers: {miner: scripted}\nstages: [miner_inclusion]\ntrials: {path: t.jsonl}\n"
        "patients: {path: p.jsonl}\n"
    )
    with pytest.raises(ConfigError, match="add 'parser'"):
        load_run_config(p)
    p.write_text(
        "name: r\nteachers: {parser: scripted}\nstages: [parser]\ntrials: {path: t.jsonl}\n"
        "patients: {path: p.jsonl, data_class: secret}\n"
    )
    with pytest.raises(ConfigError, match="data_class"):
        load_run_config(p)
