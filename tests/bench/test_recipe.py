"""The Table 2 recipe: the held-out split, the generated configs, the sbatch chain, and (slow) the
whole chain on a real local SLURM cluster with a tiny student, the scripted server as API teacher
and vLLM CPU serving the trained adapters."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from verdict.bench.bench_config import load_bench_config
from verdict.bench.recipe import Layout, prepare, render, steps
from verdict.bench.recipe_config import load_recipe
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedResponse, ScriptedServer
from verdict.slurm.job_config import load_slurm_config

from tests.data_gen.teacher_data import parser_rules
from tests.support import REPO, VERDICT

from . import scenario

CLI = VERDICT
N_TRIALS, N_PATIENTS = 8, 4


def write_corpus(root: Path) -> dict:
    """A TREC-layout corpus: 8 trials x (one or two judged patients), scores 0/1/2."""
    root.mkdir(parents=True, exist_ok=True)
    trials = [
        {
            "nct_id": f"NCT9{i:07d}",
            "title": f"Synthetic trial {i}",
            "inclusion": f"Adults aged 18 or older\nDiagnosis of condition {i}",
            "exclusion": "Pregnancy",
        }
        for i in range(N_TRIALS)
    ]
    (root / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
    notes = [f"A {30 + 9 * j}-year-old woman with condition {j}. Not pregnant." for j in range(N_PATIENTS)]
    (root / "patients.jsonl").write_text(
        "".join(json.dumps({"_id": f"trec-{j}", "text": n}) + "\n" for j, n in enumerate(notes))
    )
    pairs = []
    for i in range(N_TRIALS):
        pairs.append(
            {
                "patient_id": f"trec-{i % N_PATIENTS}",
                "nct_id": trials[i]["nct_id"],
                "score": 2 if i % 2 else 1,
            }
        )
        pairs.append(
            {"patient_id": f"trec-{(i + 1) % N_PATIENTS}", "nct_id": trials[i]["nct_id"], "score": 0}
        )
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return {
        "pairs": str(root / "pairs.jsonl"),
        "patients": str(root / "patients.jsonl"),
        "trials": [str(root / "trials.jsonl")],
    }


def write_recipe(tmp_path: Path, teacher: str, **over) -> Path:
    data = {
        "name": "tiny-recipe",
        "work_dir": str(tmp_path / "recipes"),
        "cache": str(tmp_path / "cache.sqlite"),
        "corpus": write_corpus(tmp_path / "corpus"),
        "split": {"heldout_per_class": 1, "seed": 3},
        "teacher": teacher,
        "teacher_budget_usd": 1.0,
        "reference_points": [
            {"label": "paper Table 2, Verdict Qwen2.5-7B (distilled)", "f1": 0.829, "n": 363}
        ],
        **over,
    }
    path = tmp_path / "tiny-recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def teacher_yaml(tmp_path: Path, url: str) -> str:
    path = tmp_path / "teacher.yaml"
    path.write_text(yaml.safe_dump(scenario.endpoint(url, name="scripted-api")))
    return str(path)


def test_split_holds_out_whole_trials_and_is_deterministic(tmp_path):
    rc = load_recipe(str(write_recipe(tmp_path, teacher="scripted")))
    out = prepare(rc)
    lay = Layout(rc.root, rc.name)
    held = [json.loads(x) for x in (lay.data / "heldout_pairs.jsonl").read_text().splitlines()]
    train = [json.loads(x) for x in (lay.data / "train_pairs.jsonl").read_text().splitlines()]
    trials = [json.loads(x)["nct_id"] for x in (lay.data / "train_trials.jsonl").read_text().splitlines()]
    assert sorted(p["score"] for p in held) == [1, 2]  # one pair per class
    assert not {p["nct_id"] for p in held} & set(trials)  # held-out trials never reach the teacher
    assert {p["nct_id"] for p in train} == set(trials) and len(train) == N_TRIALS - 2
    assert out["split"]["dropped"] == {"score 0 (not relevant)": N_TRIALS}
    first = {p.name: p.read_bytes() for p in lay.data.iterdir()}
    prepare(rc)
    assert {p.name: p.read_bytes() for p in lay.data.iterdir()} == first
    # the generated configs load, and point where the steps write
    bench = load_bench_config(str(lay.configs / "bench.yaml"))
    assert [b.name for b in bench.backends] == [
        "verdict-scripted",
        "verdict-qwen-base",
        "verdict-qwen-distilled",
        "llmmatch-scripted",
        "llmmatch-qwen-base",
    ]
    assert bench.vllm.adapters == {
        "parser": str(lay.runs / "tiny-recipe-parser"),  # the training runs (vllm.adapters checks them)
        "value_miner": str(lay.runs / "tiny-recipe-value_miner"),
    }
    assert bench.dataset.pairs == str(lay.data / "heldout_pairs.jsonl")
    run = yaml.safe_load((lay.configs / "teacher_run.yaml").read_text())
    assert run["trials"]["path"] == str(lay.data / "train_trials.jsonl")


def test_chain_renders_one_script_per_step_with_dependencies(tmp_path):
    rc = load_recipe(str(write_recipe(tmp_path, teacher="scripted")))
    prepare(rc)
    names = [s.name for s in steps(rc)]
    assert names == [
        "teacher",
        "export",
        "train-parser",
        "eval-parser",
        "train-value_miner",
        "eval-value_miner",
        "bench",
    ]
    assert {s.name: s.after for s in steps(rc)}["bench"] == ["train-parser", "train-value_miner"]
    scfg = load_slurm_config(
        REPO / "configs" / "slurm" / "default.yaml", [f"workdir={tmp_path}", f"log_dir={tmp_path / 'logs'}"]
    )
    scripts = render(rc, scfg, tmp_path / "sbatch")
    assert list(scripts) == names
    teacher = scripts["teacher"].read_text()
    bench = scripts["bench"].read_text()
    train = scripts["train-parser"].read_text()
    assert "#SBATCH --job-name=verdict-teacher-tiny-recipe" in teacher and "--gres" not in teacher
    assert "#SBATCH --gres=gpu:1" in bench and "#SBATCH --mem=64G" in bench
    assert "#SBATCH --gres=gpu:1" in train and "#SBATCH --time=10:00:00" in train  # slurm config's train job
    assert f"exec verdict bench run -c {rc.root / 'configs' / 'bench.yaml'} --no-progress" in bench
    assert "Runs after: train-parser, train-value_miner" in bench
    assert "source .venv/bin/activate" in teacher


def test_recipe_cli_errors_are_clear(tmp_path):
    r = subprocess.run([*CLI, "bench", "recipe", "prepare", "no-such-recipe"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: no bench/recipes config named 'no-such-recipe'")
    bad = write_recipe(tmp_path, teacher="scripted", split={"heldout_per_class": 50})
    r = subprocess.run([*CLI, "bench", "recipe", "prepare", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "no training pairs left" in r.stderr


def test_shipped_recipe_loads():
    rc = load_recipe("qwen2.5-7b-trec2021")
    assert rc.teacher == "gpt-5-mini" and rc.students.base_model.endswith("Qwen2.5-7B-Instruct")


def teacher_script() -> Script:
    """Valid programs for every synthetic trial; null values; a fixed direct-matcher answer."""
    rules = [r for i in range(N_TRIALS) for r in parser_rules(i)]  # per criterion
    rules.append(
        Rule(
            match=Match(contains=[scenario.MATCH_MARK]),
            responses=[
                ScriptedResponse(content={"criteria": [], "verdict": "eligible", "rationale": "scripted"})
            ],
        )
    )
    return Script(rules=rules, default=ScriptedResponse(auto="nulls"))


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.vllm
def test_whole_chain_on_slurm_with_a_tiny_student(slurm_cluster, student_base_dir, tmp_path):
    from tests.fixtures.vllm import vllm_available, vllm_python
    from tests.support import need

    need(vllm_available(), f"vLLM environment missing ({vllm_python()})")
    with ScriptedServer(teacher_script()) as srv:
        recipe = write_recipe(
            tmp_path,
            teacher=teacher_yaml(tmp_path, srv.url),
            students={
                "base_model": str(student_base_dir),
                "train_overrides": [
                    "bf16=false",
                    "device=cpu",
                    "gradient_checkpointing=false",
                    "batch_size=2",
                    "grad_accum=1",
                    "lr=1e-2",
                    "lr_scheduler=constant",
                    "warmup_ratio=0",
                    "max_steps=4",
                    "save_steps=4",
                    "logging_steps=2",
                    "eval_split=null",
                ],
                "eval_overrides": ["max_new_tokens=32", "batch_size=2", "device=cpu", "limit=2"],
                "max_tokens": {"parser": 128, "miner_inclusion": 64, "miner_exclusion": 64},
                "llm_match_max_tokens": 64,
                "vllm": {"device": "cpu", "dtype": "float32", "max_model_len": 4096, "ready_timeout_s": 600},
            },
            jobs={
                "teacher": {"time": "0:10:00", "mem": "2G", "cpus": 1, "gpus": 0},
                "export": {"time": "0:10:00", "mem": "2G", "cpus": 1, "gpus": 0},
                "bench": {"time": "0:30:00", "mem": "6G", "cpus": 1, "gpus": 1},
            },
        )
        r = subprocess.run(
            [
                *CLI,
                "bench",
                "recipe",
                "submit",
                str(recipe),
                "--slurm",
                "local",
                "--wait",
                "--timeout",
                "1800",
                "--set-slurm",
                f"workdir={REPO}",
                "--set-slurm",
                f"log_dir={tmp_path / 'logs'}",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=slurm_cluster.env(),
            timeout=2000,
        )
        logs = sorted((tmp_path / "logs").glob("*.out")) if (tmp_path / "logs").exists() else []
        tails = "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in logs)
        assert r.returncode == 0, f"{r.stderr[-3000:]}\n{tails}"
    lines = r.stdout.strip().splitlines()
    ids = json.loads("\n".join(lines[:-1]))["jobs"]
    assert set(json.loads(lines[-1])["states"].values()) == {"COMPLETED"} and len(ids) == 7
    root = tmp_path / "recipes" / "tiny-recipe"
    for task in ("parser", "value_miner"):
        assert (root / "runs" / f"tiny-recipe-{task}" / "adapter" / "adapter_config.json").is_file()
    s = json.loads((root / "bench" / "tiny-recipe" / "results.json").read_text())
    assert s["status"] == "complete" and s["dataset"]["pairs"] == 2
    b = s["backends"]
    assert b["verdict-teacher"]["coverage"]["decided"] == 2  # the API teacher decides every held-out pair
    assert b["llmmatch-teacher"]["coverage"]["decided"] == 2
    for name in ("verdict-qwen-base", "verdict-qwen-distilled", "llmmatch-qwen-base"):  # real vLLM answers
        c = b[name]["coverage"]
        assert c["decided"] + c["failed"] == 2 and c["missing"] == 0, name  # every pair has a result
        assert b[name]["tokens"]["completion_total"] > 0, name  # the local students really answered
    assert (
        "paper Table 2, Verdict Qwen2.5-7B (distilled)"
        in (root / "bench" / "tiny-recipe" / "report.md").read_text()
    )


def test_paper_split_every_fifth_trial_and_parse_limited_drop(tmp_path):
    """split: paper: the sorted NCT ids' 5th and 10th are the test trials (80/20 by trial); the
    test trial without criteria text is dropped as parse-limited and counted; the rest train."""
    path = write_recipe(tmp_path, teacher="scripted", split="paper", students={"limits": "paper"})
    root = tmp_path / "corpus"
    trials = [json.loads(x) for x in (root / "trials.jsonl").read_text().splitlines()]
    extra = [
        {"nct_id": f"NCT9{i:07d}", "title": f"t{i}", "inclusion": "Adults", "exclusion": "Pregnancy"}
        for i in range(N_TRIALS, 10)
    ]
    # NCT90000009 (the 10th id) is judged but has no criteria text: no usable program.
    (root / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials + extra[:-1]))
    with open(root / "pairs.jsonl", "a") as f:
        for i, t in enumerate(extra):
            f.write(json.dumps({"patient_id": f"trec-{i}", "nct_id": t["nct_id"], "score": 2}) + "\n")
    rc = load_recipe(str(path))
    assert rc.split.method == "paper" and rc.students.max_tokens["parser"] == 2560
    out = prepare(rc)
    lay = Layout(rc.root, rc.name)
    held = [json.loads(x) for x in (lay.data / "heldout_pairs.jsonl").read_text().splitlines()]
    train_trials = [
        json.loads(x)["nct_id"] for x in (lay.data / "train_trials.jsonl").read_text().splitlines()
    ]
    ps = out["split"]["paper_split"]
    assert ps["trials"] == 10 and ps["test_trials"] == 2
    assert ps["test_pairs"] == {
        "pairs": 2,
        "eligible": 1,
        "ineligible": 1,
    }  # NCT90000004 (score 1), NCT90000009 (2)
    assert ps["parse_limited"] == 1 and ps["parse_limited_reasons"] == {"no criteria text": 1}
    assert [p["nct_id"] for p in held] == ["NCT90000004"] and ps["heldout"]["pairs"] == 1
    assert "NCT90000004" not in train_trials and "NCT90000009" not in train_trials and len(train_trials) == 8
    bench = yaml.safe_load((lay.configs / "bench.yaml").read_text())
    distilled = next(b for b in bench["backends"] if b["name"] == "verdict-qwen-distilled")
    assert distilled["parser"]["limits"] == "paper" and bench["vllm"]["max_model_len"] == 4096


def test_recipe_students_limits_contradiction_names_both(tmp_path):
    path = write_recipe(
        tmp_path, teacher="scripted", students={"limits": "paper", "vllm": {"max_model_len": 8192}}
    )
    with pytest.raises(Exception, match=r"vllm.max_model_len: 8192 contradicts limits 'paper' \(4096\)"):
        load_recipe(str(path))
