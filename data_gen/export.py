"""Export accepted records as SFT datasets: one folder per task (`parser`, `value_miner`).

`<out>/<task>/` holds a `datasets.DatasetDict` (`save_to_disk`; splits train, validation, test),
`<split>.jsonl` copies, `dataset_card.json` and `README.md`. Each row: `messages` (system, user,
assistant = the exact compact JSON the student must emit), `task`, `record_id`, `trial_id`,
`patient_id` (null for the parser), `stage`, `teacher`, `prompt_version`. One row per accepted stage
call: the parser's rows are per criterion (record id `parser:<trial>#<criterion id>`), a chunked
miner pass gives one row per chunk; the assembled program of a trial is not a training example.
The same prompt twice (a criterion that recurs across trials) is kept once, in the split of the
first trial that has it.

Splits are by trial id: every record of a trial (parser and value-miner, every teacher, every
recorded variant) lands in the same split, so no trial is in two splits. `split_by="trial+patient"`
also keeps each patient in one split (connected groups of trials and patients). The assignment
is a seeded shuffle of the groups, identical for both tasks.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from verdict.core.errors import VerdictError

from .records import Record, RecordStore
from .sft_record import DATASET_TASKS, TASKS, SftRecord, datasets_quietly, features

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class RunRecords:
    name: str
    records: list[Record]


def load_run_records(run_dir: str | Path) -> RunRecords:
    d = Path(run_dir)
    db = d / "records.sqlite"
    if not db.exists():
        raise VerdictError(
            f"{d} is not a teacher run (no records.sqlite); give a run folder such as runs/NAME"
        )
    store = RecordStore(db)
    try:
        return RunRecords(d.name, store.records())
    finally:
        store.close()


class _Groups:
    """Union-find over 't:<trial>' and 'p:<patient>' nodes."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def split_counts(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Groups per split; with 3+ groups every split with a positive fraction gets at least one."""
    n_val = round(n * fractions[1])
    n_test = round(n * fractions[2])
    if n >= 3:
        n_val = max(n_val, 1 if fractions[1] > 0 else 0)
        n_test = max(n_test, 1 if fractions[2] > 0 else 0)
    n_val = min(n_val, n)
    n_test = min(n_test, n - n_val)
    return n - n_val - n_test, n_val, n_test


def assign_splits(
    records: list[Record], seed: int, fractions: tuple[float, float, float], split_by: str = "trial"
) -> dict[str, str]:
    """trial_id -> split."""
    g = _Groups()
    for r in records:
        g.find(f"t:{r.trial_id}")
        if split_by == "trial+patient" and r.patient_id:
            g.union(f"t:{r.trial_id}", f"p:{r.patient_id}")
    roots = sorted({g.find(f"t:{r.trial_id}") for r in records})
    random.Random(seed).shuffle(roots)
    n_train, n_val, _ = split_counts(len(roots), fractions)
    split_of_root = {
        root: SPLITS[0] if i < n_train else SPLITS[1] if i < n_train + n_val else SPLITS[2]
        for i, root in enumerate(roots)
    }
    return {r.trial_id: split_of_root[g.find(f"t:{r.trial_id}")] for r in records}


def _row(run: str, r: Record, provenance: dict[str, dict] | None = None) -> dict:
    prov = None
    if provenance is not None:  # review exports (serve/reviews/export.py): JSON text per row
        prov = json.dumps(provenance.get(r.record_id) or {}, sort_keys=True)
    return SftRecord.of_call(
        r.messages,
        r.output_json or "",
        task=r.task,
        record_id=f"{run}:{r.record_id}",
        trial_id=r.trial_id,
        patient_id=r.patient_id,
        stage=r.stage,
        teacher=r.teacher,
        prompt_version=r.prompt_version,
        provenance=prov,
    ).row()


def _stats(xs: list[int]) -> dict:
    if not xs:
        return {"total": 0, "mean": 0, "max": 0}
    return {"total": sum(xs), "mean": round(statistics.fmean(xs), 1), "max": max(xs)}


def export_datasets(
    run_dirs: list[str | Path],
    out: str | Path,
    *,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    split_by: str = "trial",
    tasks: tuple[str, ...] = TASKS,
    overwrite: bool = False,
    provenance: dict[str, dict] | None = None,
    card_extra: dict | None = None,
) -> dict[str, dict]:
    """Write one dataset folder per task; return the dataset cards. `provenance` (record id -> dict)
    adds a `provenance` column; `card_extra` is merged into every card (e.g. `data_class`)."""
    from datasets import Dataset, DatasetDict

    if abs(sum(fractions) - 1) > 1e-6 or any(f < 0 for f in fractions):
        raise VerdictError(f"split fractions must be >= 0 and sum to 1 (got {fractions})")
    if split_by not in ("trial", "trial+patient"):
        raise VerdictError(f"split_by must be 'trial' or 'trial+patient' (got '{split_by}')")
    unknown = set(tasks) - set(DATASET_TASKS)
    if unknown:
        raise VerdictError(f"unknown task(s) {sorted(unknown)} (known: {', '.join(DATASET_TASKS)})")
    runs = [load_run_records(d) for d in run_dirs]
    out = Path(out)
    for task in tasks:
        if (out / task).exists() and not overwrite:
            raise VerdictError(f"{out / task} exists; pass --overwrite to replace it")

    # One split assignment for every task and run: a trial is in the same split everywhere.
    accepted = [
        (run.name, r) for run in runs for r in run.records if r.status == "accepted" and r.task in tasks
    ]
    split_of = assign_splits([r for _, r in accepted], seed, fractions, split_by)

    cards = {}
    for task in tasks:
        rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
        seen: set[str] = set()
        dupes = 0
        recs = []
        for run_name, r in accepted:
            if r.task != task:
                continue
            # The same prompt from two runs or teachers: keep the first (runs in the order given).
            ident = hashlib.sha256(json.dumps(r.messages, sort_keys=True).encode()).hexdigest()
            if ident in seen:
                dupes += 1
                continue
            seen.add(ident)
            rows[split_of[r.trial_id]].append(_row(run_name, r, provenance))
            recs.append(r)
        trial_sets = {s: {row["trial_id"] for row in rows[s]} for s in SPLITS}
        for a in SPLITS:  # the promise of this module, checked on what is written
            for b in SPLITS:
                if a < b and trial_sets[a] & trial_sets[b]:
                    raise AssertionError(f"trial in two splits: {sorted(trial_sets[a] & trial_sets[b])[:3]}")
        task_dir = out / task
        if task_dir.exists():
            shutil.rmtree(task_dir)
        task_dir.mkdir(parents=True)
        feats = features(provenance is not None)
        # from_dict keeps the columns of an empty split (from_list would lose them)
        dd = DatasetDict(
            {
                s: Dataset.from_dict({c: [r[c] for r in rows[s]] for c in feats}, features=feats)
                for s in SPLITS
            }
        )
        # one shard per split: an empty split saved with none cannot be loaded again (load_from_disk fails)
        with datasets_quietly():
            dd.save_to_disk(str(task_dir), num_shards={s: 1 for s in SPLITS})
        for s in SPLITS:
            with open(task_dir / f"{s}.jsonl", "w", encoding="utf-8") as f:
                for row in rows[s]:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        all_task = [r for run in runs for r in run.records if r.task == task]
        card = _card(task, runs, all_task, recs, rows, trial_sets, dupes, seed, fractions, split_by)
        card.update(card_extra or {})
        (task_dir / "dataset_card.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
        (task_dir / "README.md").write_text(_readme(card))
        cards[task] = card
    return cards


def _card(task, runs, all_task, recs, rows, trial_sets, dupes, seed, fractions, split_by) -> dict:
    rejected = [r for r in all_task if r.status == "rejected"]
    reasons = Counter(r.reason or "unknown" for r in rejected)
    by_stage = {}
    for stage in sorted({r.stage for r in all_task}):
        rs = [r for r in all_task if r.stage == stage]
        rej = [r for r in rs if r.status == "rejected"]
        by_stage[stage] = {
            "records": len(rs),
            "accepted": len(rs) - len(rej),
            "rejected": len(rej),
            "rejection_rate": round(len(rej) / len(rs), 4) if rs else 0.0,
            "reasons": dict(Counter(r.reason or "unknown" for r in rej).most_common()),
        }
    return {
        "task": task,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": [r.name for r in runs],
        "split": {"by": split_by, "seed": seed, "fractions": dict(zip(SPLITS, fractions))},
        "counts": {s: len(rows[s]) for s in SPLITS},
        "trials": {s: len(trial_sets[s]) for s in SPLITS},
        "patients": {s: len({row["patient_id"] for row in rows[s] if row["patient_id"]}) for s in SPLITS},
        "teachers": dict(Counter(r.teacher for r in recs).most_common()),
        "models": dict(Counter(r.model for r in recs).most_common()),
        "prompt_versions": dict(Counter(r.prompt_version for r in recs).most_common()),
        "stages": dict(Counter(r.stage for r in recs).most_common()),
        "records": {
            "total": len(all_task),
            "accepted": len(all_task) - len(rejected),
            "rejected": len(rejected),
            "rejection_rate": round(len(rejected) / len(all_task), 4) if all_task else 0.0,
            "repaired": sum(r.repaired for r in all_task if r.status == "accepted"),
            "duplicates_dropped": dupes,
        },
        "rejection_reasons": dict(reasons.most_common()),
        "by_stage": by_stage,
        "tokens": {
            "prompt_tokens": _stats([r.prompt_tokens for r in recs]),
            "completion_tokens": _stats([r.completion_tokens for r in recs]),
            "target_chars": _stats([len(r.output_json or "") for r in recs]),
            "prompt_chars": _stats([sum(len(m["content"]) for m in r.messages) for r in recs]),
            "note": "prompt/completion tokens are the teacher's usage for the calls behind each example "
            "(a repaired example counts both calls; recorded examples made no call and count 0)",
        },
    }


def _readme(card: dict) -> str:
    lines = [
        f"# Verdict distillation set: `{card['task']}`",
        "",
        "Chat-format SFT examples (system, user, assistant). The assistant turn is the exact compact JSON "
        "the student must emit; every example passed the verdict_core checks (schema, compiles, "
        "satisfiable, declared atoms, verbatim evidence).",
        "",
        f"Runs: {', '.join(card['runs'])}. Split by {card['split']['by']} (seed {card['split']['seed']}): "
        "no trial is in two splits.",
        "",
        "| split | examples | trials | patients |",
        "|---|---|---|---|",
    ]
    for s in SPLITS:
        lines.append(f"| {s} | {card['counts'][s]} | {card['trials'][s]} | {card['patients'][s]} |")
    rec = card["records"]
    lines += [
        "",
        f"Records: {rec['total']} ({rec['accepted']} accepted, {rec['rejected']} rejected, rate "
        f"{rec['rejection_rate']:.1%}; {rec['repaired']} accepted after one repair; "
        f"{rec['duplicates_dropped']} duplicate prompts dropped).",
        "",
        *(
            [f"Data class: `{card['data_class']}`. {card.get('data_rules', '')}", ""]
            if card.get("data_class")
            else []
        ),
        "Rejection reasons: "
        + (", ".join(f"{k} {v}" for k, v in card["rejection_reasons"].items()) or "none"),
        "",
        "Teachers: " + ", ".join(f"{k} ({v})" for k, v in card["teachers"].items()),
        "",
        "Prompt versions: " + ", ".join(f"{k} ({v})" for k, v in card["prompt_versions"].items()),
        "",
    ]
    t = card["tokens"]
    lines += [
        f"Tokens per example: prompt mean {t['prompt_tokens']['mean']} (max {t['prompt_tokens']['max']}), "
        f"completion mean {t['completion_tokens']['mean']} (max {t['completion_tokens']['max']}).",
        "",
    ]
    return "\n".join(lines)
