"""Run directory helpers (verdict.train.run_dir)."""

import pytest
from verdict.train.run_dir import RunDir, RunError, code_version, open_run, write_atomic


def test_info_updates_merge_and_writes_are_atomic(tmp_path):
    run = RunDir(tmp_path / "r")
    run.write_info(status="running", a=1)
    run.write_info(status="completed")
    assert run.read_info() == {"status": "completed", "a": 1}
    write_atomic(tmp_path / "x.txt", "hello")
    assert (tmp_path / "x.txt").read_text() == "hello"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x.txt")]  # no temp files left


def test_open_run_needs_a_config(tmp_path):
    with pytest.raises(RunError, match="does not exist"):
        open_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="is not a training run"):
        open_run(tmp_path / "empty")


def test_code_version_names_its_source():
    assert code_version().startswith(("git:", "package:", "unknown"))


def test_eval_dir_is_one_folder_per_dataset_and_split(tmp_path):
    assert RunDir(tmp_path).eval_dir("public/parser", "test") == tmp_path / "eval" / "public__parser" / "test"
