"""Model files pinned by content (serve/model_files.py): the digest follows the bytes, not the place;
a training run folder stands for its adapter; a folder that cannot be read is said, not skipped; a
serve config's vllm section names the folders by default."""

import shutil

import yaml
from verdict.serve.config import load_serve_config
from verdict.serve.model_files import ModelFiles, folder_digest, pin


def adapter(folder, weights: bytes = b"\x00\x01weights"):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_the_digest_follows_the_bytes_not_the_place(tmp_path):
    a = adapter(tmp_path / "a")
    b = shutil.copytree(a, tmp_path / "elsewhere" / "b")
    assert folder_digest(a) == folder_digest(b) and folder_digest(a).startswith("sha256:")
    (b / "adapter_model.safetensors").write_bytes(b"\x00\x01weightz")  # one byte retrained
    assert folder_digest(a) != folder_digest(b)
    (b / "adapter_model.safetensors").rename(b / "renamed.safetensors")  # names count too
    assert folder_digest(b) != folder_digest(a)


def test_a_run_folder_pins_its_adapter_and_a_missing_folder_is_named(tmp_path):
    run = tmp_path / "runs" / "students" / "value_miner"
    adapter(run / "adapter")
    (run / "run_info.json").write_text('{"status": "running"}')
    assert "has not completed" in pin(str(run))  # an unfinished run pins nothing, and says so
    (run / "run_info.json").write_text('{"status": "completed"}')
    assert pin(str(run)) == folder_digest(run / "adapter")
    gone = pin(str(tmp_path / "nope"))
    assert gone.startswith("unavailable:") and str(tmp_path / "nope") in gone
    pins = ModelFiles({"value_miner": str(run), "base": str(tmp_path / "nope")}).pins()
    assert pins["value_miner"].startswith("sha256:") and pins["base"].startswith("unavailable:")


def test_a_serve_config_pins_what_its_vllm_section_serves(tmp_path):
    cfg = {
        "vllm": {"model": "base-model", "adapters": {"parser": "runs/p", "value_miner": "runs/v"}},
        "api": {"formalizer": {}},
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(cfg))
    files = load_serve_config(tmp_path / "serve.yaml").api.formalizer.model_files
    assert files == {
        "base": str(tmp_path / "base-model"),
        "parser": str(tmp_path / "runs" / "p"),
        "value_miner": str(tmp_path / "runs" / "v"),
    }
    cfg["api"]["formalizer"]["model_files"] = {"value_miner": "elsewhere/v"}  # the api may name others
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(cfg))
    files = load_serve_config(tmp_path / "serve.yaml").api.formalizer.model_files
    assert files == {"value_miner": str(tmp_path / "elsewhere" / "v")}
