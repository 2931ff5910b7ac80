"""The one config loader (verdict.core.configs): strict models, dotted `--set` overrides, and a
did-you-mean for every config kind the project ships."""

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml
from pydantic import Field
from verdict.core import configs
from verdict.core.configs import ConfigError, StrictModel
from verdict.core.errors import VerdictError

from tests.support import REPO, run_verdict


# ---- the loader itself ----------------------------------------------------------------------------
class Lora(StrictModel):
    r: int = 8
    alpha: int = 64


class Dataset(StrictModel):
    path: str
    weight: float = 1.0


class Demo(StrictModel):
    name: str
    lr: float = 1e-4
    bf16: bool = True
    time: str = "1:00:00"
    lora: Lora = Lora()
    datasets: list[Dataset] = Field(default_factory=list)


BASE = {"name": "r", "datasets": [{"path": "d"}]}


def test_override_sets_nested_keys_and_parses_values():
    data = configs.apply_overrides(
        BASE, ["lr=1e-3", "lora.r=16", "bf16=false", "datasets=[{path: x, weight: 2}]"], Demo
    )
    cfg = Demo.model_validate(data)
    assert cfg.lr == 1e-3 and cfg.lora.r == 16 and cfg.bf16 is False
    assert cfg.lora.alpha == 64  # untouched siblings keep their defaults
    assert cfg.datasets[0].path == "x" and cfg.datasets[0].weight == 2


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("lrr=1", "unknown config key 'lrr' (did you mean 'lr'?)"),
        ("lora.rank=8", "unknown config key 'lora.rank' (known keys: alpha, r)"),
        ("lr.x=1", "'lr' has no sub-keys"),
        ("lr", "is not KEY=VALUE"),
        ("=1", "empty key"),
    ],
)
def test_bad_overrides_are_refused_by_name(item, fragment):
    with pytest.raises(ConfigError) as e:
        configs.apply_overrides(BASE, [item], Demo)
    assert fragment in str(e.value)


def test_unknown_keys_in_a_file_are_named_in_nested_models_and_lists(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("datasets: [{path: d, wieght: 2}]\nlearning_rate: 1e-4\nlora: {r: 8, alfa: 3}\n")
    with pytest.raises(ConfigError) as e:
        configs.load(Demo, f, ["name=x"])
    msg = str(e.value)
    assert "unknown config key 'learning_rate' (known keys: bf16, datasets, lora, lr, name, time)" in msg
    assert "unknown config key 'lora.alfa' (did you mean 'alpha'?)" in msg
    assert "unknown config key 'datasets.0.wieght' (did you mean 'weight'?)" in msg


def test_yaml_is_read_without_base_60_numbers(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: x\ntime: 10:00:00\nlr: 1e-3\n")  # YAML 1.1 would read 36000 and the string '1e-3'
    cfg = configs.load(Demo, f)
    assert cfg.time == "10:00:00" and cfg.lr == 1e-3


def test_bad_value_bad_yaml_and_the_error_class_asked_for(tmp_path):
    with pytest.raises(ConfigError, match="lr: Input should be a valid number"):
        configs.build(Demo, BASE, ["lr=fast"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        configs.read_yaml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        configs.read_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        configs.read_yaml(tmp_path / "list.yaml")

    class KindError(VerdictError):
        pass

    with pytest.raises(KindError, match="did you mean 'lr'"):
        configs.build(Demo, BASE, ["lrr=1"], error=KindError)


def test_names_are_found_with_a_did_you_mean(tmp_path, monkeypatch):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "site-rules.yaml").write_text("name: x\n")
    monkeypatch.setenv("VERDICT_CONFIG_DIR", str(tmp_path))
    assert configs.find_config("policies", "site-rules") == tmp_path / "policies" / "site-rules.yaml"
    with pytest.raises(
        ConfigError, match=r"no policies config named 'prescren' \(did you mean 'prescreen'\?\)"
    ):
        configs.find_config("policies", "prescren")
    with pytest.raises(ConfigError, match="does not exist"):
        configs.find_config("policies", tmp_path / "nope.yaml")


# ---- every config kind the project ships ----------------------------------------------------------
@dataclass
class Kind:
    id: str
    shipped: str  # the real config file, relative to the checkout
    key: tuple[str, ...]  # the key to misspell (a dotted path)
    load: Callable  # (file, tmp_path, monkeypatch) -> loads the file as that kind
    data: Callable | None = None  # (shipped file, tmp_path) -> the mapping written; default: the file


def _prompt(f, tmp_path, monkeypatch):
    from verdict.data_gen.formalizer import prompt_templates

    monkeypatch.setattr(prompt_templates, "PROMPTS_DIR", f.parent)
    prompt_templates._load.cache_clear()
    try:
        prompt_templates.load_prompt("criterion_parser", "v1")
    finally:
        prompt_templates._load.cache_clear()


def _train_run_dir(f, tmp_path, monkeypatch):
    from verdict.train.run_dir import open_run

    run = tmp_path / "run"
    run.mkdir()
    f.rename(run / "config.yaml")
    open_run(run)


def _train_run_dump(shipped, tmp_path):
    from verdict.train.sft_config import load_train_config

    return load_train_config(shipped).model_dump(mode="json")  # what a run directory stores


def _bench_run_dir(f, tmp_path, monkeypatch):
    from verdict.bench.bench_config import load_bench_config
    from verdict.bench.runner import BenchRun

    cfg = load_bench_config("sigir-recorded", [f"out_dir={tmp_path / 'runs'}"])
    cfg.run_dir.mkdir(parents=True)
    f.rename(cfg.run_dir / "config.yaml")
    BenchRun(cfg).prepare_dir()


def _bench_run_dump(shipped, tmp_path):
    from verdict.bench.bench_config import load_bench_config

    return load_bench_config(shipped, [f"out_dir={tmp_path / 'runs'}"]).model_dump(mode="json")


def _call(loader: str) -> Callable:
    def load(f, tmp_path, monkeypatch):
        module, name = loader.rsplit(".", 1)
        fn = __import__(module, fromlist=[name])
        for part in name.split(":"):
            fn = getattr(fn, part)
        fn(f)

    return load


KINDS = [
    Kind(
        "policy",
        "configs/policies/strict.yaml",
        ("rules", 0, "reason"),
        _call("verdict.core.policy.load_policy"),
    ),
    Kind(
        "teacher",
        "configs/teachers/gpt-5-mini.yaml",
        ("prices", "input_per_million"),
        _call("verdict.data_gen.formalizer.endpoint_config.load_teacher"),
    ),
    Kind(
        "teacher run",
        "configs/teacher_runs/scripted-demo.yaml",
        ("budget_usd",),
        _call("verdict.data_gen.teacher_config.load_run_config"),
    ),
    Kind("prompt", "data_gen/formalizer/prompts/criterion_parser.v1.yaml", ("system",), _prompt),
    Kind(
        "scripted-server script",
        "examples/teacher/scripted-demo.yaml",
        ("rules", 0, "responses"),
        _call("verdict.data_gen.scripted_server.Script:load"),
    ),
    Kind(
        "train",
        "configs/train/parser.yaml",
        ("base_model",),
        _call("verdict.train.sft_config.load_train_config"),
    ),
    Kind(
        "eval",
        "configs/train/eval.yaml",
        ("batch_size",),
        _call("verdict.train.eval_config.load_eval_config"),
    ),
    Kind(
        "train run directory",
        "configs/train/parser.yaml",
        ("lora", "dropout"),
        _train_run_dir,
        _train_run_dump,
    ),
    Kind(
        "slurm",
        "configs/slurm/default.yaml",
        ("jobs", "train", "signal_seconds"),
        _call("verdict.slurm.job_config.load_slurm_config"),
    ),
    Kind(
        "serve",
        "configs/serve/cpu-tiny.yaml",
        ("vllm", "served_model_name"),
        _call("verdict.serve.config.load_serve_config"),
    ),
    Kind(
        "bench",
        "configs/bench/sigir-recorded.yaml",
        ("repeats",),
        _call("verdict.bench.bench_config.load_bench_config"),
    ),
    Kind(
        "bench run directory",
        "configs/bench/sigir-recorded.yaml",
        ("reference_points",),
        _bench_run_dir,
        _bench_run_dump,
    ),
    Kind(
        "bench recipe",
        "configs/bench/recipes/qwen2.5-7b-trec2021.yaml",
        ("teacher_budget_usd",),
        _call("verdict.bench.recipe_config.load_recipe"),
    ),
    Kind(
        "limits",
        "configs/limits/paper.yaml",
        ("max_new_tokens",),
        _call("verdict.data_gen.formalizer.budget.load_limits"),
    ),
    Kind(
        "FHIR code map",
        "configs/fhir/codes.yaml",
        ("version",),
        _call("verdict.data_gen.fhir.code_map.load_code_map"),
    ),
]


def _typo(key: str) -> str:
    return key[:-1] if len(key) > 4 else key + "s"  # 'budget_usd' -> 'budget_us', 'mem' -> 'mems'


@pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])
def test_every_config_kind_refuses_a_misspelled_key_with_a_did_you_mean(kind, tmp_path, monkeypatch):
    shipped = REPO / kind.shipped
    data = kind.data(shipped, tmp_path) if kind.data else yaml.safe_load(shipped.read_text())
    node = data
    for part in kind.key[:-1]:
        node = node[part]
    last = kind.key[-1]
    assert last in node, f"{kind.shipped} has no key {kind.key}: pick another"
    typo = _typo(last)
    node[typo] = node.pop(last)
    folder = tmp_path / "cfg"
    folder.mkdir()
    f = folder / shipped.name
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(VerdictError) as e:
        kind.load(f, tmp_path, monkeypatch)
    where = ".".join(str(p) for p in (*kind.key[:-1], typo))
    assert f"unknown config key '{where}' (did you mean '{last}'?)" in str(e.value), str(e.value)


@pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])
def test_the_shipped_config_of_every_kind_loads(kind, tmp_path, monkeypatch):
    shipped = REPO / kind.shipped
    data = kind.data(shipped, tmp_path) if kind.data else yaml.safe_load(shipped.read_text())
    folder = tmp_path / "cfg"
    folder.mkdir()
    f = folder / shipped.name
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    kind.load(f, tmp_path, monkeypatch)


# ---- --set on every command line that loads a config ----------------------------------------------
verdict = run_verdict


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["teacher", "run", "-c", "scripted-demo", "--dry-run", "--set", "trails.limit=1"],
            "unknown config key 'trails' (did you mean 'trials'?)",
        ),
        (
            ["teacher", "scripted-server", "--set", "default_latency=1"],
            "unknown config key 'default_latency' (did you mean 'default_latency_s'?)",
        ),
        (
            ["train", "--config", "parser", "--set", "lora.alpah=8"],
            "unknown config key 'lora.alpah' (did you mean 'alpha'?)",
        ),
        (
            ["bench", "run", "-c", "sigir-recorded", "--set", "repeat=2"],
            "unknown config key 'repeat' (did you mean 'repeats'?)",
        ),
        (
            ["bench", "recipe", "steps", "qwen2.5-7b-trec2021", "--set", "split.heldout_per_clas=5"],
            "unknown config key 'split.heldout_per_clas' (did you mean 'heldout_per_class'?)",
        ),
        (
            ["serve", "api", "--config", "cpu-tiny", "--set", "api.prot=1"],
            "unknown config key 'api.prot' (did you mean 'port'?)",
        ),
        (
            ["slurm", "render", "--train", "parser", "--set", "partiton=gpu"],
            "unknown config key 'partiton' (did you mean 'partition'?)",
        ),
    ],
    ids=["teacher run", "scripted-server", "train", "bench run", "bench recipe", "serve", "slurm"],
)
def test_every_config_command_takes_set_and_names_a_misspelled_key(args, message):
    r = verdict(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_teacher_run_set_changes_the_run_config():
    r = verdict("teacher", "run", "-c", "scripted-demo", "--dry-run", "--set", "name=renamed-demo")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dry run renamed-demo:"), r.stdout


def test_scripted_server_set_changes_the_script():
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "verdict.data_gen.scripted_server", "--set", "default={content: hello}"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        url = proc.stdout.readline().split()[-1]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
        assert reply["choices"][0]["message"]["content"] == "hello"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
