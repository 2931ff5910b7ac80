"""The Table 2 recipe as a chain of resumable steps, run on SLURM (or one after another locally).

    prepare   split the TREC pairs: held-out evaluation pairs (class-balanced, seeded) and the
              training trials (every trial of a held-out pair is held out with it); write the
              teacher-run and bench configs the later steps read (deterministic: rerunning it
              writes the same files)
    teacher   `verdict teacher run`: the API teacher's parser and value-miner outputs on the
              training trials (resumable; the call cache never pays twice)
    export    `verdict teacher export`: SFT datasets, split by trial
    train-*   `verdict train`: LoRA of the parser and the value-miner student (checkpoints; a job
              stopped at its time limit resumes when resubmitted)
    eval-*    `verdict train eval`: each student against held-out teacher records (appends per record)
    bench     `verdict bench run`: Verdict with the API teacher, base Qwen and distilled Qwen (plus
              the direct matcher) on the held-out pairs; starts vLLM with both adapters itself

Every step is a `verdict` command in the site's checkout; on SLURM they are chained with
``--dependency=afterok`` and rendered from slurm/templates/base.sbatch.j2 with slurm's configs.
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from verdict.core.progress import Progress
from verdict.data_gen.sft_record import TASKS

from .protocol import BenchError
from .recipe_config import RecipeConfig

TEMPLATES = Path(__file__).resolve().parent / "templates"
STUDENT_PLACEHOLDER_URL = "http://127.0.0.1:8000/v1"  # replaced by the run's vLLM server (local_vllm)


@dataclass
class Step:
    name: str
    command: list[str]
    after: list[str] = field(default_factory=list)
    resources: str = "bench"  # recipe job kind (teacher/export/bench) or slurm job kind (train/eval)
    purpose: str = ""

    @property
    def line(self) -> str:
        return shlex.join(self.command)


@dataclass
class Layout:
    """Where the chain writes (all under the recipe's root)."""

    root: Path
    name: str

    data = property(lambda s: s.root / "data")
    configs = property(lambda s: s.root / "configs")
    slurm = property(lambda s: s.root / "slurm")
    runs = property(lambda s: s.root / "runs")
    sft = property(lambda s: s.root / "sft")
    bench = property(lambda s: s.root / "bench")
    teacher_run = property(lambda s: f"{s.name}-teacher")

    def student_run(self, task: str) -> Path:
        return self.runs / f"{self.name}-{task}"


# ---- prepare: split + generated configs ----------------------------------------------------------
def split_pairs(recipe: RecipeConfig) -> dict:
    """Held-out pairs and the training side (trials of no held-out pair): `seeded` samples the
    held-out pairs class-balanced; `paper` splits by trial (`paper_split`)."""
    from .datasets import DatasetConfig, SampleConfig, load_dataset, sample_pairs

    c = recipe.corpus
    s = recipe.split
    # The paper's split is over every judged pair: a test trial without criteria text is parse-limited.
    ds = load_dataset(
        DatasetConfig(
            kind="trec2021",
            pairs=c.pairs,
            patients=c.patients,
            trials=c.trials,
            data_class="public",
            require_text=s.method != "paper",
        )
    )
    extra: dict = {}
    if s.method == "paper":
        ps = paper_split(ds, s.test_every, parse_limited_reason(recipe))
        heldout, extra = ps.pop("heldout"), ps
        held_trials = set(ps.pop("test_trials"))
        usable = [p for p in ds.pairs if p.patient_id in ds.patients and p.trial_id in ds.trials]
    else:
        heldout = sample_pairs(ds.pairs, SampleConfig(per_class=s.heldout_per_class, seed=s.seed))
        held_trials = {p.trial_id for p in heldout}
        usable = ds.pairs
    train_trials = sorted({p.trial_id for p in usable} - held_trials)
    if s.max_train_trials is not None and len(train_trials) > s.max_train_trials:
        train_trials = sorted(random.Random(s.seed).sample(train_trials, s.max_train_trials))
    keep = set(train_trials)
    train = [p for p in usable if p.trial_id in keep]
    if not train:
        raise BenchError(
            "no training pairs left after holding out the evaluation trials: lower "
            "split.heldout_per_class or use a larger corpus"
        )
    return {"heldout": heldout, "train": train, "train_trials": train_trials, "dataset": ds, **extra}


def paper_split(ds, every: int, limited) -> dict:
    """The paper's split by trial: sort the unique NCT ids of the judged pairs, every `every`-th
    (the 5th, 10th, ... : 80/20) is a test trial; its pairs are the test side. Then the test pairs
    with no usable program are dropped and counted: `limited(trial_id)` names why a trial has
    none ('parse-limited'), None when it has one. A test pair without a note is dropped too."""
    ids = sorted({p.trial_id for p in ds.pairs})
    test_trials = [t for i, t in enumerate(ids, 1) if i % every == 0]
    held = set(test_trials)
    test = [p for p in ds.pairs if p.trial_id in held]
    reasons = {t: limited(t) for t in test_trials}
    parse_limited: dict[str, int] = {}
    heldout, no_note = [], 0
    for p in test:
        if reasons[p.trial_id]:
            parse_limited[reasons[p.trial_id]] = parse_limited.get(reasons[p.trial_id], 0) + 1
        elif p.patient_id not in ds.patients:
            no_note += 1
        else:
            heldout.append(p)
    return {
        "heldout": heldout,
        "test_trials": test_trials,
        "paper_split": {
            "trials": len(ids),
            "test_trials": len(test_trials),
            "test_pairs": _label_counts(test),
            "parse_limited": sum(parse_limited.values()),
            "parse_limited_reasons": parse_limited,
            "no_note": no_note,
            "heldout": _label_counts(heldout),
        },
    }


def _label_counts(pairs) -> dict:
    return {
        "pairs": len(pairs),
        "eligible": sum(p.label == "eligible" for p in pairs),
        "ineligible": sum(p.label == "ineligible" for p in pairs),
    }


def parse_limited_reason(recipe: RecipeConfig):
    """Whether a trial can get a usable program from the students' parser, decided before any model
    runs: it needs criteria text, at least one criterion, and every criterion within the parser's
    prompt budget (`students.limits`; split as the parser splits). Returns trial id -> reason|None."""
    from verdict.data_gen.formalizer import criterion_messages, load_limits, split_trial
    from verdict.data_gen.sources import load_trials

    trials: dict = {}
    for path in recipe.corpus.trials:
        for t in load_trials(path).items:
            trials.setdefault(t.trial_id, t)
    lim = load_limits(recipe.students.limits)
    counter, budget = lim.counter(), lim.prompt_budget("parser")

    def reason(trial_id: str) -> str | None:
        trial = trials.get(trial_id)
        if trial is None:
            return "no criteria text"
        sp = split_trial(trial, lambda c: counter.count_messages(criterion_messages(c)) <= budget)
        if not sp.criteria:
            return "no criteria found"
        if sp.oversize:
            return "a criterion exceeds the parser's prompt budget"
        return None

    return reason


def _score(label: str) -> int:
    return 2 if label == "eligible" else 1


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def prepare(recipe: RecipeConfig) -> dict:
    """Write data/{heldout_pairs,train_pairs,train_trials}.jsonl, data/split.json and
    configs/{teacher_run,bench}.yaml; return what was written."""
    lay = Layout(recipe.root, recipe.name)
    for d in (lay.data, lay.configs):
        d.mkdir(parents=True, exist_ok=True)
    sp = split_pairs(recipe)
    _write_jsonl(
        lay.data / "heldout_pairs.jsonl",
        [{"patient_id": p.patient_id, "nct_id": p.trial_id, "score": _score(p.label)} for p in sp["heldout"]],
    )
    _write_jsonl(
        lay.data / "train_pairs.jsonl",
        [{"patient_id": p.patient_id, "nct_id": p.trial_id, "score": _score(p.label)} for p in sp["train"]],
    )
    wanted = set(sp["train_trials"])
    rows: dict[str, str] = {}
    for path in recipe.corpus.trials:  # the training trials' rows, verbatim (first file holding an id wins)
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                tid = json.loads(line).get("nct_id")
                if tid in wanted and tid not in rows:
                    rows[tid] = line if line.endswith("\n") else line + "\n"
    (lay.data / "train_trials.jsonl").write_text("".join(rows[t] for t in sp["train_trials"] if t in rows))

    def counts(ps):
        return {
            "pairs": len(ps),
            "eligible": sum(p.label == "eligible" for p in ps),
            "trials": len({p.trial_id for p in ps}),
            "patients": len({p.patient_id for p in ps}),
        }

    summary = {
        "recipe": recipe.name,
        "split": recipe.split.method,
        "seed": recipe.split.seed,
        "corpus": recipe.corpus.model_dump(),
        "heldout": counts(sp["heldout"]),
        "train": counts(sp["train"]),
        **({"paper_split": sp["paper_split"]} if "paper_split" in sp else {}),
        "dataset_problems": sp["dataset"].problems,
        "dropped": sp["dataset"].dropped,
    }
    (lay.data / "split.json").write_text(json.dumps(summary, indent=2))
    teacher_run = _teacher_run_config(recipe, lay)
    bench = bench_config_data(recipe, lay)
    _write_yaml(
        lay.configs / "teacher_run.yaml", teacher_run, "teacher run of the recipe (`verdict teacher run`)"
    )
    _write_yaml(lay.configs / "bench.yaml", bench, "benchmark of the recipe (`verdict bench run`)")
    _check_generated(lay)
    return {
        "split": summary,
        "teacher_run": str(lay.configs / "teacher_run.yaml"),
        "bench": str(lay.configs / "bench.yaml"),
    }


def _write_yaml(path: Path, data: dict, what: str) -> None:
    path.write_text(
        f"# Written by `verdict bench recipe prepare`: the {what}.\n"
        + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    )


def _teacher_run_config(recipe: RecipeConfig, lay: Layout) -> dict:
    return {
        "name": lay.teacher_run,
        "description": f"teacher outputs on the training trials of recipe {recipe.name}",
        "out_dir": str(lay.runs),
        "cache": recipe.cache,
        "teachers": {"parser": recipe.teacher, "miner": recipe.teacher},
        "trials": {"path": str(lay.data / "train_trials.jsonl")},
        "patients": {"path": recipe.corpus.patients, "data_class": "public"},
        "pairs": {"path": str(lay.data / "train_pairs.jsonl"), "scores": [1, 2]},
        "budget_usd": recipe.teacher_budget_usd,
    }


def _student_endpoint(recipe: RecipeConfig, name: str, model: str) -> dict:
    st = recipe.students
    limits = {"limits": st.limits} if st.limits else {"max_tokens": dict(st.max_tokens)}
    return {
        "name": name,
        "base_url": STUDENT_PLACEHOLDER_URL,
        "model": model,
        "structured_output": "vllm",
        "temperature": 0.0,
        **limits,
        "timeout_s": 900,
        "concurrency": 16,
        "max_retries": 2,
    }


def bench_config_data(recipe: RecipeConfig, lay: Layout) -> dict:
    t = recipe.teacher
    tname = Path(t).stem
    base = _student_endpoint(recipe, "qwen-base", "base")
    backends = [
        {
            "name": f"verdict-{tname}",
            "kind": "formalizer",
            "parser": t,
            "miner": t,
            "description": "Verdict with the API teacher as formalizer",
        },
        {
            "name": "verdict-qwen-base",
            "kind": "formalizer",
            "parser": base,
            "miner": base,
            "local_vllm": True,
            "description": "Verdict with the base student model, no adapter",
        },
        {
            "name": "verdict-qwen-distilled",
            "kind": "formalizer",
            "local_vllm": True,
            "parser": _student_endpoint(recipe, "qwen-parser", "parser"),
            "miner": _student_endpoint(recipe, "qwen-value-miner", "value_miner"),
            "description": "Verdict with the distilled students (LoRA adapters)",
        },
    ]
    if recipe.llm_match:
        backends += [
            {"name": f"llmmatch-{tname}", "kind": "llm_match", "endpoint": t},
            {
                "name": "llmmatch-qwen-base",
                "kind": "llm_match",
                "endpoint": base,
                "local_vllm": True,
                "max_tokens": recipe.students.llm_match_max_tokens,
            },
        ]
    vllm = {
        "model": recipe.students.base_model,
        "adapters": {task: str(lay.student_run(task)) for task in TASKS},  # the training runs
        **recipe.students.vllm,
    }
    c = recipe.corpus
    return {
        "name": recipe.name,
        "description": f"Table 2 recipe {recipe.name}: held-out TREC 2021 pairs",
        "out_dir": str(lay.bench),
        "cache": recipe.cache,
        "dataset": {
            "kind": "trec2021",
            "pairs": str(lay.data / "heldout_pairs.jsonl"),
            "patients": c.patients,
            "trials": list(c.trials),
            "data_class": "public",
        },
        "backends": backends,
        "policy": recipe.policy,
        "budget_usd": recipe.bench_budget_usd,
        "vllm": vllm,
        "reference_points": recipe.reference_points,
    }


def _check_generated(lay: Layout) -> None:
    """Refuse now, not hours later in a job, if a generated config does not load."""
    from verdict.data_gen.teacher_config import load_run_config

    from .bench_config import load_bench_config

    load_run_config(lay.configs / "teacher_run.yaml")
    load_bench_config(str(lay.configs / "bench.yaml"))


# ---- the chain -------------------------------------------------------------------------------------
def steps(recipe: RecipeConfig, verdict: str = "verdict") -> list[Step]:
    from verdict.core.configs import find_config

    lay = Layout(recipe.root, recipe.name)
    st = recipe.students
    out = [
        Step(
            "teacher",
            [verdict, "teacher", "run", "-c", str(lay.configs / "teacher_run.yaml"), "--no-progress"],
            resources="teacher",
            purpose="API teacher outputs on the training trials",
        ),
        Step(
            "export",
            [
                verdict,
                "teacher",
                "export",
                str(lay.runs / lay.teacher_run),
                "--out",
                str(lay.sft),
                "--split-by",
                "trial",
                "--overwrite",
            ],
            ["teacher"],
            "export",
            "SFT datasets (train/validation/test by trial)",
        ),
    ]
    for task in TASKS:
        cfg = find_config("train", st.train_configs[task]).resolve()
        sets = [
            f"base_model={st.base_model}",
            f"datasets=[{{path: {lay.sft / task}}}]",
            f"output_dir={lay.runs}",
            f"name={lay.student_run(task).name}",
            *st.train_overrides,
        ]
        train = [verdict, "train", "--config", str(cfg)] + [x for s in sets for x in ("--set", s)]
        ev = [
            verdict,
            "train",
            "eval",
            "--run",
            str(lay.student_run(task)),
            "--split",
            "test",
            "--config",
            str(find_config("train", st.eval_config).resolve()),
        ]
        ev += [x for s in st.eval_overrides for x in ("--set", s)]
        out += [
            Step(f"train-{task}", train, ["export"], "train", f"LoRA training of the {task} student"),
            Step(
                f"eval-{task}",
                ev,
                [f"train-{task}"],
                "eval",
                f"the {task} student vs held-out teacher records",
            ),
        ]
    out.append(
        Step(
            "bench",
            [verdict, "bench", "run", "-c", str(lay.configs / "bench.yaml"), "--no-progress"],
            [f"train-{t}" for t in TASKS],
            "bench",
            "Verdict with teacher, base and distilled Qwen on the held-out pairs",
        )
    )
    return out


def render(recipe: RecipeConfig, slurm_cfg, out_dir: Path | None = None) -> dict[str, Path]:
    """One sbatch script per step (slurm/templates/base.sbatch.j2 + bench/templates/step.sbatch.j2)."""
    from verdict.slurm.render import render_text, write_script

    lay = Layout(recipe.root, recipe.name)
    out = Path(out_dir) if out_dir else lay.slurm
    scripts = {}
    for s in steps(recipe):
        res = getattr(recipe.jobs, s.resources, None) or getattr(slurm_cfg.jobs, s.resources)
        text = render_text(
            "step.sbatch.j2",
            s.name,
            slurm_cfg,
            recipe.name,
            s.line,
            res,
            templates=(TEMPLATES,),
            recipe=recipe.name,
            step=s.name,
            purpose=s.purpose,
            after=s.after,
        )
        scripts[s.name] = write_script(out / f"{len(scripts):02d}-{s.name}.sbatch", text)
    return scripts


def submit(recipe: RecipeConfig, scripts: dict[str, Path], env: dict | None = None) -> dict[str, str]:
    """sbatch every step, each after the steps it needs (afterok)."""
    from verdict.slurm.submit import Job, submit_jobs

    return submit_jobs([Job(s.name, scripts[s.name], after=list(s.after)) for s in steps(recipe)], env)


def run_locally(recipe: RecipeConfig, progress: Progress = print, only: list[str] | None = None) -> None:
    """The same steps one after another in this shell (a site without SLURM, or a dry run)."""
    for s in steps(recipe):
        if only and s.name not in only:
            continue
        progress(f"[recipe {recipe.name}] {s.name}: {s.line}")
        r = subprocess.run(s.command)
        if r.returncode != 0:
            raise BenchError(
                f"recipe step '{s.name}' failed (exit {r.returncode}); fix it and run the same command "
                "again: finished steps are resumed, not redone"
            )
