"""Serve config paths: relative paths from the config's root (not the working directory), adapters
given as training run folders."""

from __future__ import annotations

import json

import pytest
from verdict.serve.config import load_serve_config
from verdict.serve.errors import ServeConfigError
from verdict.serve.site_paths import adapter_folder

from tests.serve.test_vllm_config import write_adapter


def training_run(folder, status="completed", adapter=True):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("task: parser\n")
    (folder / "run_info.json").write_text(json.dumps({"status": status}))
    if adapter:
        write_adapter(folder / "adapter", 8)
    return folder


def test_an_adapter_may_be_a_completed_training_run(tmp_path):
    run = training_run(tmp_path / "runs" / "parser")
    assert adapter_folder(run) == (run / "adapter").resolve()
    plain = write_adapter(tmp_path / "plain", 8)
    assert adapter_folder(plain) == plain.resolve()


def test_an_unfinished_run_or_a_missing_folder_is_named(tmp_path):
    running = training_run(tmp_path / "r1", status="running", adapter=False)
    with pytest.raises(ServeConfigError, match="has not completed .*status: running"):
        adapter_folder(running)
    with pytest.raises(ServeConfigError) as e:
        adapter_folder(tmp_path / "nowhere")
    assert f"adapter folder {tmp_path / 'nowhere'} does not exist" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ServeConfigError, match="neither a LoRA adapter folder"):
        adapter_folder(tmp_path / "empty")


def test_relative_paths_come_from_the_config_root_whatever_the_working_directory(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "configs" / "serve").mkdir(parents=True)
    cfg = site / "configs" / "serve" / "s.yaml"
    cfg.write_text(
        "root: ../..\n"
        "vllm: {model: models/base, adapters: {parser: runs/students/parser}}\n"
        "api: {api_keys: state/keys.json}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    seen = []
    for cwd in (site, elsewhere):
        monkeypatch.chdir(cwd)
        c = load_serve_config(cfg)
        seen.append((c.vllm.model, c.vllm.adapters["parser"], c.api.api_keys, c.api.audit_db))
    assert (
        seen[0]
        == seen[1]
        == (
            str(site / "models" / "base"),
            str(site / "runs" / "students" / "parser"),
            str(site / "state" / "keys.json"),
            str(site / "runs" / "serve" / "audit.sqlite"),  # the default, from the root too
        )
    )
    # no root: the config file's folder; a --set path is taken from the root as well
    cfg.write_text("vllm: {model: base}\napi: {audit_db: 'postgresql://verdict@db:5432/audit'}\n")
    c = load_serve_config(cfg, ["vllm.log_file=logs/v.log"])
    assert c.vllm.model == str(cfg.parent / "base") and c.vllm.log_file == str(cfg.parent / "logs" / "v.log")
    assert c.api.audit_db == "postgresql://verdict@db:5432/audit"
