"""`verdict train eval`: score a student against the teacher records of a held-out split.

For each record the student generates greedily (batched); its output is checked for JSON validity
and schema validity (the stage's typed output model, as the formalizer checks it; the definitions
are the project's shared ones, `verdict.core.metrics`) and compared atom by atom with the
teacher's. Rates carry Wilson 95% intervals; p95 interpolates (the same numbers `verdict bench`
reports). The number that matters is *decision agreement*: the core decides every
patient-trial pair of the split twice, once on the teacher's outputs and once with the student's
outputs in their place, and the two decisions are compared.

Work is resumable and shardable: predictions are appended per record to
``eval/<dataset>/<split>/predictions[.shard-K-of-N].jsonl`` (the project's JSONL record store,
`verdict.core.jsonl_store`: a line torn by a kill is cut before the next append) and records
already there are not generated again; the report is computed from all prediction files once
every record has one.
Predictions contain evidence quotes from patient notes: they stay in the run directory and never
go to the logs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from verdict.core.errors import VerdictError
from verdict.core.jsonl_store import JsonlStore
from verdict.core.metrics import NO_JSON, format_rate, output_validity, percentile, rate
from verdict.core.progress import Progress, to_stderr
from verdict.data_gen.sft_record import target as teacher_output

from . import sft_data
from .eval_config import EvalConfig
from .run_dir import RunDir, RunError, open_run, write_atomic
from .sft_config import TrainConfig

REPORT_FORMAT = "verdict.student_eval/v2"  # v2: rates as {k, n, rate, ci95}; schema_valid = the output model
COMPANION = {"parser": "value_miner", "value_miner": "parser"}


class EvalError(VerdictError):
    """Evaluation cannot run or cannot be reported (missing run, adapter, split or predictions)."""


@dataclass
class Target:
    """What is evaluated: a completed run's adapter on its base model."""

    run: RunDir
    cfg: TrainConfig

    @property
    def adapter(self) -> str:
        return str(self.run.adapter)


def open_target(run_path: str | Path) -> Target:
    run = open_run(run_path)
    cfg = TrainConfig.model_validate(run.read_config())
    if not (run.adapter / "adapter_config.json").is_file():
        raise RunError(f"run '{run.path}' has no adapter yet: train it first (`verdict train --config ...`)")
    return Target(run=run, cfg=cfg)


# ---- checking one output -------------------------------------------------------------------------
@dataclass
class Checked:
    json_ok: bool
    schema_ok: bool  # JSON that validates as the stage's output model (`verdict.core.metrics`)
    reason: str | None  # the formalizer's rejection category: empty | truncated | json | schema
    parsed: object | None  # ParsedCriterion / ParsedTrial / ValueMinerOutput when schema_ok
    error: str | None


def check_output(task: str, text: str) -> Checked:
    """The formalizer's own first check (`parse_output`): JSON, then the task's output model."""
    from verdict.data_gen.formalizer import parse_output

    parsed, problems = parse_output(text, None, 0, sft_data.output_model(task, text))
    if parsed is not None:
        return Checked(True, True, None, parsed, None)
    reason, message = problems[0]
    return Checked(reason not in NO_JSON, False, reason, None, message.removeprefix("output."))


# ---- atom-level agreement ------------------------------------------------------------------------
def same_value(a, b) -> bool:
    """Equal values of the same kind: True is not 1, 45 is 45.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _has(mv) -> bool:
    return mv is not None and (mv.value is not None or mv.bounds is not None)


def miner_atom_counts(teacher, student) -> Counter:
    """Per teacher atom: value (and bounds) agree, status (value vs null) agrees, evidence agrees;
    an atom the student leaves out (or an unusable output) agrees on nothing."""
    c = Counter()
    s_by = {v.atom: v for v in (student.values if student else [])}
    t_names = set()
    for t in teacher.values:
        t_names.add(t.atom)
        s = s_by.get(t.atom)
        c["atoms"] += 1
        c["value_agree"] += int(s is not None and same_value(s.value, t.value) and s.bounds == t.bounds)
        c["status_agree"] += int(s is not None and _has(s) == _has(t))  # an atom left out says nothing
        c["evidence_agree"] += int(s is not None and s.evidence == t.evidence)
        c["missing"] += int(s is None)
    c["extra"] += len(set(s_by) - t_names)
    return c


def parser_atom_counts(teacher, student) -> Counter:
    """Atom names (precision/recall), declarations of shared atoms, and criterion formulas."""
    c = Counter()
    t_atoms = {a.name: a for a in teacher.atoms}
    s_atoms = {a.name: a for a in (student.atoms if student else [])}
    shared = set(t_atoms) & set(s_atoms)
    c["teacher_atoms"] += len(t_atoms)
    c["student_atoms"] += len(s_atoms)
    c["shared_atoms"] += len(shared)
    c["declaration_agree"] += sum(
        (t_atoms[n].domain, t_atoms[n].kind, t_atoms[n].unit)
        == (s_atoms[n].domain, s_atoms[n].kind, s_atoms[n].unit)
        for n in shared
    )

    def crits(p):
        return (
            {
                (co.id, side, cr.id): cr.formula
                for co in p.cohorts
                for side in ("inclusion", "exclusion")
                for cr in getattr(co, side)
            }
            if p
            else {}
        )

    t_cr, s_cr = crits(teacher), crits(student)
    c["criteria"] += len(t_cr)
    c["criteria_formula_agree"] += sum(1 for k, f in t_cr.items() if k in s_cr and s_cr[k] == f)
    return c


def atom_summary(task: str, c: Counter) -> dict:
    """Atom-level agreement; every proportion is a rate with its Wilson interval (atom_f1, not a
    proportion, is a bare number)."""
    if task == "value_miner":
        return {
            "atoms": c["atoms"],
            "value_agreement": rate(c["value_agree"], c["atoms"]),
            "status_agreement": rate(c["status_agree"], c["atoms"]),
            "evidence_agreement": rate(c["evidence_agree"], c["atoms"]),
            "missing_atoms": c["missing"],
            "extra_atoms": c["extra"],
        }
    p, r = rate(c["shared_atoms"], c["student_atoms"]), rate(c["shared_atoms"], c["teacher_atoms"])
    pr, rr = p["rate"], r["rate"]
    return {
        "teacher_atoms": c["teacher_atoms"],
        "student_atoms": c["student_atoms"],
        "atom_precision": p,
        "atom_recall": r,
        "atom_f1": round(2 * pr * rr / (pr + rr), 6)
        if pr and rr
        else (0.0 if pr is not None and rr is not None else None),
        "declaration_agreement": rate(c["declaration_agree"], c["shared_atoms"]),
        "criteria": c["criteria"],
        "criterion_formula_agreement": rate(c["criteria_formula_agree"], c["criteria"]),
    }


# ---- decision agreement --------------------------------------------------------------------------
def _program(trial_id: str, parsed):
    from verdict.core.program import load_program

    return load_program({"trial_id": trial_id, **parsed.model_dump(mode="json", by_alias=True)})


def _fitting(program, values: list) -> list:
    """Values the program can take (declared atom, right domain); the rest are already counted as
    atom disagreements and would only make `resolve` refuse the whole patient."""
    from verdict.core.patient import value_type_problems

    table = program.atom_table()
    return [
        v
        for v in values
        if v.atom in table and not value_type_problems(table[v.atom].domain, v.value, v.bounds)
    ]


class DecisionScorer:
    def __init__(self, cfg: EvalConfig):
        from verdict.core.engine import Engine
        from verdict.core.policy import load_policy

        self.policy = load_policy(cfg.policy)
        self.engine = Engine(timeout_ms=cfg.engine_timeout_ms, alternatives=0)
        self.pairs = 0
        self.agree = 0
        self.confusion: dict[str, Counter] = defaultdict(Counter)
        self.skipped: Counter = Counter()

    def decide(self, program, patient_id: str, values: list) -> str:
        from verdict.core.policy import resolve

        patient = resolve(program, patient_id, values, self.policy)
        return self.engine.decide(program, patient).decision

    def add(
        self, teacher_program, student_program, patient_id: str, teacher_values: list, student_values: list
    ):
        try:
            t = self.decide(teacher_program, patient_id, teacher_values)
        except VerdictError:
            self.skipped["teacher outputs do not decide"] += 1
            return
        if student_program is None:
            s = "invalid_output"
        else:
            try:
                s = self.decide(student_program, patient_id, _fitting(student_program, student_values))
            except VerdictError:
                s = "invalid_output"
        self.pairs += 1
        self.agree += int(s == t)
        self.confusion[t][s] += 1

    def summary(self) -> dict:
        return {
            "available": True,
            "policy": f"{self.policy.name} v{self.policy.version}",
            "pairs": self.pairs,
            "agree": self.agree,
            "agreement": rate(self.agree, self.pairs),
            "confusion": {t: dict(sorted(c.items())) for t, c in sorted(self.confusion.items())},
            "skipped": dict(self.skipped),
        }


def _load_companion(path: Path | None, task: str) -> list[dict] | None:
    if path is None or not path.is_dir():
        return None
    dd = sft_data.load_dataset_dict(path)
    rows = []
    for split in dd:
        sft_data.check_split(dd[split], task, f"dataset '{path}' split '{split}'")
        rows.extend(dd[split].to_list())
    return rows


def decision_agreement(
    task: str, rows: list[dict], checked: dict[str, Checked], dataset_path: Path, cfg: EvalConfig
) -> dict:
    from verdict.core.patient import ValueMinerOutput
    from verdict.core.program import ParsedTrial

    if task == "parser" and any(sft_data.is_criterion_output(teacher_output(r)) for r in rows):
        return {
            "available": False,
            "reason": "per-criterion parser records: the decision agreement needs each trial's "
            "assembled program (verdict.data_gen.formalizer.assembly), not computed here yet",
        }
    other = COMPANION[task]
    explicit = cfg.programs if task == "value_miner" else cfg.pairs
    src = Path(explicit) if explicit else dataset_path.parent / other
    companion = _load_companion(src, other)
    if companion is None:
        key = "programs" if task == "value_miner" else "pairs"
        return {
            "available": False,
            "reason": f"no {other} dataset at '{src}' (set '{key}' in the eval config)",
        }
    scorer = DecisionScorer(cfg)

    if task == "value_miner":
        # A trial may have programs from several teachers or runs; the miner's values belong to the
        # one that declares all of its atoms.
        programs: dict[str, list] = defaultdict(list)
        for r in companion:
            if sft_data.is_criterion_output(teacher_output(r)):
                continue  # per-criterion parser records: no whole program per row
            try:
                programs[r["trial_id"]].append(
                    _program(r["trial_id"], ParsedTrial.model_validate_json(teacher_output(r)))
                )
            except VerdictError:
                pass
        by_pair: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            by_pair[(r["trial_id"], r["patient_id"])].append(r)
        for (tid, pid), recs in sorted(by_pair.items()):
            t_vals = [v for r in recs for v in ValueMinerOutput.model_validate_json(teacher_output(r)).values]
            program = next(
                (p for p in programs.get(tid, []) if len(_fitting(p, t_vals)) == len(t_vals)), None
            )
            if program is None:
                scorer.skipped["no teacher program of the trial declares the teacher's atoms"] += 1
                continue
            s_vals = [
                v
                for r in recs
                if checked[r["record_id"]].parsed is not None
                for v in checked[r["record_id"]].parsed.values
            ]
            scorer.add(program, program, pid, t_vals, s_vals)
        return scorer.summary()

    # parser: the student's program replaces the teacher's; values come from the teacher's miner
    values: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in companion:
        values[r["trial_id"]][r["patient_id"]].extend(
            ValueMinerOutput.model_validate_json(teacher_output(r)).values
        )
    for r in rows:
        tid = r["trial_id"]
        if not values.get(tid):
            scorer.skipped["no patient pairs for the trial"] += 1
            continue
        try:
            t_prog = _program(tid, ParsedTrial.model_validate_json(teacher_output(r)))
        except VerdictError:
            scorer.skipped["teacher program invalid"] += 1
            continue
        s_prog = None
        if checked[r["record_id"]].parsed is not None:
            try:
                s_prog = _program(tid, checked[r["record_id"]].parsed)
            except VerdictError:
                s_prog = None
        for pid, vals in sorted(values[tid].items()):
            scorer.add(t_prog, s_prog, pid, _fitting(t_prog, vals), vals)
    return scorer.summary()


# ---- predictions ---------------------------------------------------------------------------------
def prediction_file(out_dir: Path, shard: int, num_shards: int) -> Path:
    return out_dir / (
        "predictions.jsonl" if num_shards == 1 else f"predictions.shard-{shard}-of-{num_shards}.jsonl"
    )


class Prediction(BaseModel):
    """One generated output: a line of a predictions file."""

    model_config = ConfigDict(extra="forbid")

    record_id: str = Field(description="the SFT record the output answers")
    output: str = Field(description="the student's raw output (may quote patient notes: stays in the run)")
    new_tokens: int = Field(ge=0, description="tokens generated")
    seconds: float = Field(ge=0, description="wall time of the batch that generated it")
    batch_size: int = Field(ge=1, description="records in that batch (seconds / batch_size: per record)")


def prediction_store(path: Path) -> JsonlStore[Prediction]:
    return JsonlStore(path, Prediction)


def read_predictions(out_dir: Path) -> dict[str, Prediction]:
    """record id -> its prediction, from every shard's file (a torn last line is left out: that
    record is generated again)."""
    preds: dict[str, Prediction] = {}
    for f in sorted(out_dir.glob("predictions*.jsonl")):
        preds.update(prediction_store(f).latest(lambda p: p.record_id))
    return preds


def generation_settings(target: Target, fingerprint: str, cfg: EvalConfig) -> dict:
    """What the predictions depend on; cached predictions made otherwise are never mixed in."""
    import hashlib

    h = hashlib.sha256()
    with open(target.run.adapter / "adapter_model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {
        "adapter_sha256": h.hexdigest(),
        "base_model": target.cfg.base_model,
        "dataset": fingerprint,
        "max_new_tokens": cfg.max_new_tokens,
        "dtype": cfg.dtype,
        "limit": cfg.limit,
    }


def check_settings(out_dir: Path, settings: dict, fresh: bool = False) -> None:
    f = out_dir / "generation.json"
    if fresh:
        for p in out_dir.glob("predictions*.jsonl"):
            p.unlink()
        f.unlink(missing_ok=True)
    if f.is_file():
        old = json.loads(f.read_text())
        diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if diff:
            raise EvalError(
                f"predictions in {out_dir} were made with other settings (differ in: {', '.join(diff)}); "
                "pass --fresh to discard them and generate again"
            )
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(f, json.dumps(settings, indent=2, sort_keys=True) + "\n")


def split_rows(path: str, task: str, split: str, cfg: EvalConfig) -> tuple[list[dict], str]:
    ds = sft_data.load_checked(path, task, [split])[split]
    if cfg.limit:
        ds = ds.select(range(min(cfg.limit, len(ds))))
    return ds.to_list(), sft_data.fingerprint(ds)


def generate(
    target: Target,
    path: str,
    label: str,
    split: str,
    cfg: EvalConfig,
    shard: int = 0,
    num_shards: int = 1,
    fresh: bool = False,
    progress: Progress = to_stderr,
) -> Path:
    """Generate the student's outputs for this shard's records that have none yet."""
    if not 0 <= shard < num_shards:
        raise EvalError(f"shard {shard} is not in 0..{num_shards - 1}")
    rows, fp = split_rows(path, target.cfg.task, split, cfg)
    out_dir = target.run.eval_dir(label, split)
    check_settings(out_dir, generation_settings(target, fp, cfg), fresh)
    done = read_predictions(out_dir)
    todo = [r for i, r in enumerate(rows) if i % num_shards == shard and r["record_id"] not in done]
    mine = sum(1 for i in range(len(rows)) if i % num_shards == shard)
    progress(
        f"eval {label}/{split} shard {shard}/{num_shards}: {mine - len(todo)} of {mine} records already "
        f"done, {len(todo)} to generate"
    )
    if not todo:
        return out_dir
    from .generation import Generator

    gen = Generator(
        target.cfg.base_model,
        target.adapter,
        device=cfg.device,
        dtype=cfg.dtype,
        max_new_tokens=cfg.max_new_tokens,
    )
    # Similar lengths batch together (less padding); order does not change greedy outputs.
    todo.sort(key=lambda r: len(gen.prompt_text(r["messages"])))
    n = 0
    # Opening cuts a line torn by a killed run, so the next prediction starts on its own line.
    with prediction_store(prediction_file(out_dir, shard, num_shards)) as store:
        for b in range(0, len(todo), cfg.batch_size):
            batch = todo[b : b + cfg.batch_size]
            made = [
                Prediction(
                    record_id=r["record_id"],
                    output=g.text,
                    new_tokens=g.new_tokens,
                    seconds=round(g.seconds, 4),
                    batch_size=g.batch_size,
                )
                for r, g in zip(batch, gen.generate([r["messages"] for r in batch]))
            ]
            store.append_many(made)
            n += len(batch)
            progress(f"  generated {n}/{len(todo)} records ({made[-1].seconds:.1f}s for the last batch)")
    return out_dir


# ---- the report ----------------------------------------------------------------------------------
def score(target: Target, path: str, label: str, split: str, cfg: EvalConfig) -> dict:
    task = target.cfg.task
    rows, fp = split_rows(path, task, split, cfg)
    out_dir = target.run.eval_dir(label, split)
    gen_file = out_dir / "generation.json"
    if gen_file.is_file():  # hand-made predictions (no generation.json) are scored as they are
        made = json.loads(gen_file.read_text())
        for key, now in (("dataset", fp), ("max_new_tokens", cfg.max_new_tokens), ("limit", cfg.limit)):
            if made.get(key) != now:
                raise EvalError(
                    f"predictions in {out_dir} were made with {key}={made.get(key)!r}, not {now!r}"
                )
    preds = read_predictions(out_dir)
    missing = [r["record_id"] for r in rows if r["record_id"] not in preds]
    if missing:
        raise EvalError(
            f"{label}/{split}: {len(missing)} of {len(rows)} records have no prediction yet "
            f"(unfinished shards?); run the generation first (e.g. {missing[0]})"
        )
    checked = {r["record_id"]: check_output(task, preds[r["record_id"]].output) for r in rows}
    counts, atoms = Counter(), Counter()
    errors = Counter()
    for r in rows:
        c, teacher_text = checked[r["record_id"]], teacher_output(r)
        output = preds[r["record_id"]].output
        teacher = sft_data.output_model(task, teacher_text).model_validate_json(teacher_text)
        counts["exact_match"] += output == teacher_text
        counts["canonical_match"] += c.json_ok and _json_or_none(output) == json.loads(teacher_text)
        if c.error:
            errors[c.error.split(":")[0]] += 1
        if task == "parser":
            atoms += parser_atom_counts(teacher, c.parsed)
            if c.parsed is not None:
                try:
                    _program(r["trial_id"], c.parsed)
                    counts["program_valid"] += 1
                except VerdictError:
                    pass
        else:
            atoms += miner_atom_counts(teacher, c.parsed)
    n = len(rows)
    validity = output_validity([checked[r["record_id"]].reason for r in rows])
    if task == "parser":
        validity["program_valid"] = rate(counts["program_valid"], n)
    p = [preds[r["record_id"]] for r in rows]
    gen_s = sum(x.seconds / x.batch_size for x in p)
    toks = sum(x.new_tokens for x in p)
    lat = sorted(x.seconds for x in p)
    report = {
        "format": REPORT_FORMAT,
        "run": str(target.run.path),
        "name": target.cfg.name,
        "task": task,
        "dataset": label,
        "dataset_path": str(path),
        "split": split,
        "fingerprint": fp,
        "records": n,
        "base_model": target.cfg.base_model,
        "adapter": target.adapter,
        "validity": validity,
        "exact_match": rate(counts["exact_match"], n),
        "canonical_match": rate(counts["canonical_match"], n),
        "error_kinds": dict(errors.most_common(10)),
        "atoms": atom_summary(task, atoms),
        "decisions": decision_agreement(task, rows, checked, Path(path), cfg),
        "performance": {
            "generated_tokens": toks,
            "generation_seconds": round(gen_s, 3),
            "tokens_per_second": round(toks / gen_s, 2) if gen_s else None,
            "latency_per_record_s": {
                "mean": round(statistics.fmean(lat), 4) if lat else None,
                "p50": _round(percentile(lat, 50)),
                "p95": _round(percentile(lat, 95)),
            },
            "seconds_per_record": round(gen_s / n, 4) if n else None,
            "batch_size": cfg.batch_size,
            "max_new_tokens": cfg.max_new_tokens,
        },
        "eval_config": cfg.model_dump(mode="json"),
    }
    write_atomic(out_dir / "report.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    write_atomic(out_dir / "report.md", render_report(report))
    return report


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _fmt(v) -> str:
    """A rate as `0.950 [0.764, 0.991]`, a number to 3 places, n/a for none."""
    if isinstance(v, dict):
        return format_rate(v)
    return "n/a" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def rate_value(v) -> float | None:
    """The bare rate of a report entry (a rate dict, or a plain number such as atom_f1)."""
    return v.get("rate") if isinstance(v, dict) else v


def render_report(r: dict) -> str:
    d = r["decisions"]
    lines = [
        f"# Student eval: {r['name']} ({r['task']}) on {r['dataset']}/{r['split']}",
        "",
        f"{r['records']} records; adapter `{r['adapter']}`",
        "",
        "| metric | value [95% CI] |",
        "|---|---|",
    ]
    for k, v in r["validity"].items():
        lines.append(f"| {k.replace('_', ' ')} | {_fmt(v)} |")
    lines += [
        f"| exact match | {_fmt(r['exact_match'])} |",
        f"| canonical JSON match | {_fmt(r['canonical_match'])} |",
    ]
    for k, v in r["atoms"].items():
        lines.append(f"| {k.replace('_', ' ')} | {_fmt(v)} |")
    if d.get("available"):
        lines.append(f"| decision agreement ({d['pairs']} pairs, {d['policy']}) | {_fmt(d['agreement'])} |")
    else:
        lines.append(f"| decision agreement | n/a: {d['reason']} |")
    perf = r["performance"]
    lines += [
        f"| tokens/s | {_fmt(perf['tokens_per_second'])} |",
        f"| latency per record (mean / p95 s) | {_fmt(perf['latency_per_record_s']['mean'])} / "
        f"{_fmt(perf['latency_per_record_s']['p95'])} |",
        "",
    ]
    if d.get("available") and d["confusion"]:
        lines += ["Decisions (rows: teacher, columns: student):", ""]
        cols = sorted({s for c in d["confusion"].values() for s in c})
        lines += ["| teacher \\ student | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for t, c in d["confusion"].items():
            lines.append(f"| {t} | " + " | ".join(str(c.get(s, 0)) for s in cols) + " |")
        lines.append("")
    return "\n".join(lines)


def evaluate(
    run_path: str | Path,
    split: str,
    cfg: EvalConfig,
    datasets: list[str] | None = None,
    shard: int = 0,
    num_shards: int = 1,
    do_generate: bool = True,
    do_report: bool = True,
    fresh: bool = False,
    progress: Progress = to_stderr,
) -> list[dict]:
    """Generate (this shard) and/or report, for each dataset (default: the run's training sets)."""
    target = open_target(run_path)
    specs = (
        [(p, _label(p)) for p in datasets] if datasets else [(d.path, d.label) for d in target.cfg.datasets]
    )
    for path, _ in specs:  # refuse up front, before any generation is paid for
        sft_data.load_checked(path, target.cfg.task, [split])
    reports = []
    for path, label in specs:
        if do_generate:
            generate(target, path, label, split, cfg, shard, num_shards, fresh, progress)
        if do_report:
            rep = score(target, path, label, split, cfg)
            reports.append(rep)
            progress(f"report: {target.run.eval_dir(label, split) / 'report.md'}")
    return reports


def _label(path: str) -> str:
    p = Path(path).resolve()
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def compare(run_paths: list[str], split: str) -> str:
    """A table of every report of ``split`` found in the given runs (before/after fine-tuning)."""
    rows = []
    for rp in run_paths:
        run = open_run(rp)
        for f in sorted((run.path / "eval").glob(f"*/{split}/report.json")):
            r = json.loads(f.read_text())
            d = r["decisions"]
            a = r["atoms"]
            rows.append(
                [
                    r["name"],
                    r["dataset"],
                    str(r["records"]),
                    _fmt(rate_value(r["validity"]["schema_valid"])),
                    _fmt(rate_value(r["exact_match"])),
                    _fmt(rate_value(a.get("value_agreement", a.get("atom_f1")))),
                    _fmt(rate_value(d.get("agreement"))) if d.get("available") else "n/a",
                ]
            )
    if not rows:
        raise EvalError(
            f"no '{split}' eval reports in {', '.join(run_paths)} (run `verdict train eval` first)"
        )
    head = ["run", "dataset", "records", "schema valid", "exact", "atom agreement", "decision agreement"]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
