"""verdict.bench.bench_config: strict configs, the backend registry, shipped configs."""

import pytest
import yaml
from verdict.bench.backends import BACKENDS
from verdict.bench.bench_config import load_bench_config
from verdict.bench.protocol import BenchError

from tests.support import REPO

BASE = {
    "name": "t",
    "dataset": {"kind": "sigir", "pairs": "gold.json", "require_text": False},
    "backends": [{"name": "rec", "kind": "recorded"}],
}


def write(tmp_path, data):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_registry_has_the_four_kinds():
    assert {"recorded", "formalizer", "llm_match", "predictions"} <= set(BACKENDS)


def test_unknown_keys_are_named(tmp_path):
    with pytest.raises(BenchError, match="unknown config key 'polcy'.*did you mean 'policy'"):
        load_bench_config(str(write(tmp_path, {**BASE, "polcy": "strict"})))
    bad = {**BASE, "backends": [{"name": "rec", "kind": "recorded", "pth": "x"}]}
    with pytest.raises(
        BenchError, match=r"backend 'rec' \(recorded\): unknown config key 'pth' \(did you mean 'path'\?\)"
    ):
        load_bench_config(str(write(tmp_path, bad)))


def test_unknown_backend_kind_lists_the_known_ones(tmp_path):
    bad = {**BASE, "backends": [{"name": "x", "kind": "oracle"}]}
    with pytest.raises(BenchError, match="unknown kind 'oracle' .known: .*formalizer.*llm_match"):
        load_bench_config(str(write(tmp_path, bad)))


def test_backend_names_unique_and_local_vllm_needs_a_server(tmp_path):
    dup = {**BASE, "backends": [{"name": "a", "kind": "recorded"}, {"name": "a", "kind": "recorded"}]}
    with pytest.raises(BenchError, match="unique .repeated: a"):
        load_bench_config(str(write(tmp_path, dup)))
    local = {
        **BASE,
        "backends": [
            {"name": "s", "kind": "formalizer", "parser": "scripted", "miner": "scripted", "local_vllm": True}
        ],
    }
    with pytest.raises(BenchError, match="local_vllm: add a 'vllm' block"):
        load_bench_config(str(write(tmp_path, local)))


def test_overrides_and_missing_config(tmp_path):
    cfg = load_bench_config(str(write(tmp_path, BASE)), ["repeats=3", "scoring.failed_as=excluded"])
    assert cfg.repeats == 3 and cfg.scoring.failed_as == "excluded"
    with pytest.raises(BenchError, match="unknown config key 'scoring.bogus'"):
        load_bench_config(str(write(tmp_path, BASE)), ["scoring.bogus=1"])
    with pytest.raises(BenchError, match="no bench config named 'nope'"):
        load_bench_config("nope")


def test_dump_keeps_backend_fields(tmp_path):
    cfg = load_bench_config(
        str(
            write(
                tmp_path,
                {
                    **BASE,
                    "backends": [
                        {"name": "rec", "kind": "recorded", "path": "somewhere", "policy": "strict"}
                    ],
                },
            )
        )
    )
    dumped = cfg.model_dump(mode="json")["backends"][0]
    assert dumped["path"] == "somewhere" and dumped["policy"] == "strict"


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "bench").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_load(path):
    cfg = load_bench_config(str(path))
    assert cfg.name == path.stem
