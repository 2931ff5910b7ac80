"""Benchmark datasets: labelled patient-trial pairs plus the notes and criteria they need.

Kinds (a registry, like the backends):
- ``trec2021``: TREC 2021 Clinical Trials judgments (`pairs_trec2021.jsonl`: patient_id, nct_id,
  score). As in the paper, score 2 -> eligible, 1 -> ineligible (excluded), 0 (not relevant) is
  dropped and counted, or (``not_relevant: rank``) kept for the ranking metrics only: decided by
  the backends, never scored as a decision;
- ``sigir``: the 552 SIGIR 2016 pairs with the paper's eligibility labels
  (`gold_5sys_freeform_balanced.json`: {"gold": {"<patient>__<trial>": true|false}});
- ``jsonl``: a site's own pairs, one JSON object a line:
  {"patient_id", "trial_id" (or "nct_id"), "label": "eligible"|"ineligible" (or true|false)}.

Notes and criteria are read with `verdict.data_gen.sources` (the benchmarks layout). A malformed row is
reported (file, line, what is wrong) and skipped, never scored; so is a pair whose note or
criteria text is missing when the dataset requires text. Optional sampling is seeded and
class-balanced (`per_class`) or uniform (`n`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from verdict.core.configs import StrictModel
from verdict.data_gen.formalizer import PatientDoc, TrialDoc

from .protocol import PAIR_SEP, BenchError, LabeledPair, pair_id


class SampleConfig(StrictModel):
    per_class: int | None = Field(None, ge=1, description="class-balanced: this many pairs of each label")
    n: int | None = Field(None, ge=1, description="uniform: this many pairs")
    seed: int = 0

    @model_validator(mode="after")
    def _one(self):
        if (self.per_class is None) == (self.n is None):
            raise ValueError("give exactly one of per_class (class-balanced) or n (uniform)")
        return self


class DatasetConfig(StrictModel):
    kind: Literal["trec2021", "sigir", "jsonl"]
    pairs: str = Field(
        description="trec2021: pairs JSONL (patient_id, nct_id, score); sigir: the gold labels "
        "JSON; jsonl: the site's labelled pairs"
    )
    patients: str | None = Field(None, description="notes JSONL {_id, text}")
    trials: list[str] = Field(
        default_factory=list,
        description="criteria: trials JSONL files (benchmarks layout) "
        "or ClinicalTrials.gov study JSON files/folders; the first holding an id wins",
    )
    data_class: Literal["private", "public", "synthetic"] = Field(
        "private",
        description="public/synthetic notes may go to API endpoints; private ones only to allowed hosts",
    )
    require_text: bool = Field(
        True, description="skip (and report) pairs whose note or criteria text is missing"
    )
    not_relevant: Literal["drop", "rank"] = Field(
        "drop",
        description="trec2021 score-0 (not relevant) pairs: dropped and counted, or kept for the "
        "ranking metrics only (decided, never scored as decisions; their trials must be in 'trials')",
    )
    patient_ids: list[str] | None = Field(None, description="keep only these patients (e.g. held-out topics)")
    sample: SampleConfig | None = None

    @model_validator(mode="after")
    def _text_sources(self):
        if self.require_text and (self.patients is None or not self.trials):
            raise ValueError("require_text needs 'patients' and 'trials' (or set require_text: false)")
        return self


@dataclass
class BenchDataset:
    kind: str
    pairs: list[LabeledPair]  # scored as decisions
    patients: dict[str, PatientDoc] = field(default_factory=dict)
    trials: dict[str, TrialDoc] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # malformed rows and pairs skipped, with why
    dropped: dict[str, int] = field(default_factory=dict)  # by design (e.g. TREC score 0), not problems
    before_sampling: int | None = None
    data_class: str = "private"
    ranking_pairs: list[LabeledPair] = field(default_factory=list)  # decided for the ranking only

    @property
    def all_pairs(self) -> list[LabeledPair]:
        """What the backends decide: the scored pairs, then the ranking-only ones."""
        return self.pairs + self.ranking_pairs

    def counts(self) -> dict[str, int]:
        out = {"eligible": 0, "ineligible": 0}
        for p in self.pairs:
            out[p.label] += 1
        return out

    def summary(self) -> dict:
        return {
            "kind": self.kind,
            "data_class": self.data_class,
            "pairs": len(self.pairs),
            "labels": self.counts(),
            "before_sampling": self.before_sampling,
            "dropped": dict(self.dropped),
            "skipped": len(self.problems),
            "problems": list(self.problems),
            "patients": len({p.patient_id for p in self.pairs}),
            "trials": len({p.trial_id for p in self.pairs}),
            "ranking_only_pairs": len(self.ranking_pairs),
        }


Loader = Callable[[DatasetConfig, list[str], dict[str, int]], list[LabeledPair]]
DATASETS: dict[str, Loader] = {}


def register_dataset(kind: str):
    def deco(fn: Loader) -> Loader:
        DATASETS[kind] = fn
        return fn

    return deco


def _label(value) -> str | None:
    if value is True or value in ("eligible", "Eligible", "ELIGIBLE"):
        return "eligible"
    if value is False or value in ("ineligible", "Ineligible", "INELIGIBLE"):
        return "ineligible"
    return None


def _read_lines(path: Path):
    if not path.is_file():
        raise BenchError(f"dataset file not found: {path}")
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield n, line
    except UnicodeDecodeError:
        raise BenchError(f"{path}: not UTF-8 text") from None


def _json_rows(path: Path, problems: list[str]):
    """(where, row, patient id, trial id) for each JSON-object line that names a pair; every other
    line is reported in ``problems`` and skipped."""
    for n, line in _read_lines(path):
        where = f"{path.name}:{n}"
        try:
            row = json.loads(line)
        except ValueError as e:
            problems.append(f"{where}: not valid JSON ({e.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"{where}: expected a JSON object")
            continue
        pid, tid = row.get("patient_id"), row.get("nct_id") or row.get("trial_id")
        if not isinstance(pid, str) or not pid or not isinstance(tid, str) or not tid:
            problems.append(f"{where}: needs 'patient_id' and 'trial_id' (or 'nct_id')")
            continue
        yield where, row, pid, tid


@register_dataset("trec2021")
def _trec(cfg: DatasetConfig, problems: list[str], dropped: dict[str, int]) -> list[LabeledPair]:
    """The track's official scores: 2 eligible, 1 excluded (ineligible), 0 not relevant (dropped, or
    kept for the ranking only)."""
    path = Path(cfg.pairs)
    out = []
    for where, row, pid, tid in _json_rows(path, problems):
        score = row.get("score")
        if score == 0 and not isinstance(score, bool):
            if cfg.not_relevant == "rank":
                out.append(
                    LabeledPair(
                        pair_id=pair_id(pid, tid),
                        patient_id=pid,
                        trial_id=tid,
                        label="ineligible",
                        grade=0,
                        ranking_only=True,
                        source=where,
                    )
                )
            else:
                dropped["score 0 (not relevant)"] = dropped.get("score 0 (not relevant)", 0) + 1
            continue
        if isinstance(score, bool) or score not in (1, 2):
            problems.append(f"{where}: 'score' must be 0, 1 or 2 (got {json.dumps(score)[:20]})")
            continue
        out.append(
            LabeledPair(
                pair_id=pair_id(pid, tid),
                patient_id=pid,
                trial_id=tid,
                label="eligible" if score == 2 else "ineligible",
                grade=score,
                source=where,
            )
        )
    return out


@register_dataset("sigir")
def _sigir(cfg: DatasetConfig, problems: list[str], dropped: dict[str, int]) -> list[LabeledPair]:
    path = Path(cfg.pairs)
    if not path.is_file():
        raise BenchError(f"dataset file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise BenchError(f"{path}: not valid JSON ({e})") from None
    gold = data.get("gold") if isinstance(data, dict) else None
    if not isinstance(gold, dict):
        raise BenchError(f'{path}: expected {{"gold": {{"<patient>__<trial>": true|false, ...}}}}')
    out = []
    for key, value in gold.items():
        where = f"{path.name}#{key}"
        pid, sep, tid = str(key).partition(PAIR_SEP)
        if not sep or not pid or not tid:
            problems.append(f"{where}: key is not '<patient>__<trial>'")
            continue
        if not isinstance(value, bool):
            problems.append(f"{where}: label must be true or false")
            continue
        out.append(LabeledPair(pair_id=key, patient_id=pid, trial_id=tid, label=_label(value), source=where))
    return out


@register_dataset("jsonl")
def _site(cfg: DatasetConfig, problems: list[str], dropped: dict[str, int]) -> list[LabeledPair]:
    path = Path(cfg.pairs)
    out = []
    for where, row, pid, tid in _json_rows(path, problems):
        label = _label(row.get("label"))
        if label is None:
            problems.append(f"{where}: 'label' must be eligible/ineligible (or true/false)")
            continue
        out.append(
            LabeledPair(pair_id=pair_id(pid, tid), patient_id=pid, trial_id=tid, label=label, source=where)
        )
    return out


def sample_pairs(pairs: list[LabeledPair], sample: SampleConfig) -> list[LabeledPair]:
    """Seeded sampling in the pairs' file order; the result keeps that order."""
    rng = random.Random(sample.seed)
    if sample.per_class is not None:
        chosen: set[str] = set()
        for label in ("eligible", "ineligible"):
            ids = [p.pair_id for p in pairs if p.label == label]
            chosen |= set(rng.sample(ids, min(sample.per_class, len(ids))))
    else:
        ids = [p.pair_id for p in pairs]
        chosen = set(rng.sample(ids, min(sample.n, len(ids))))
    return [p for p in pairs if p.pair_id in chosen]


def load_dataset(cfg: DatasetConfig) -> BenchDataset:
    from verdict.data_gen.sources import load_patients, load_trials

    problems: list[str] = []
    dropped: dict[str, int] = {}
    pairs = DATASETS[cfg.kind](cfg, problems, dropped)
    seen: set[str] = set()
    unique = []
    for p in pairs:
        if p.pair_id in seen:
            problems.append(f"{p.source}: pair '{p.pair_id}' repeats an earlier row (first kept)")
            continue
        seen.add(p.pair_id)
        unique.append(p)
    pairs = unique
    if cfg.patient_ids is not None:
        keep = set(cfg.patient_ids)
        n0 = len(pairs)
        pairs = [p for p in pairs if p.patient_id in keep]
        if n0 > len(pairs):
            dropped["patient not selected"] = n0 - len(pairs)
    patients: dict[str, PatientDoc] = {}
    trials: dict[str, TrialDoc] = {}
    if cfg.patients:
        loaded = load_patients(cfg.patients, data_class=cfg.data_class)
        problems += loaded.problems
        patients = loaded.by_id("patient_id")
    wanted = {p.trial_id for p in pairs}
    for path in cfg.trials:
        loaded = load_trials(path)
        problems += [x for x in loaded.problems if "duplicate trial id" not in x]
        for t in loaded.items:
            if t.trial_id in wanted:
                trials.setdefault(t.trial_id, t)
    ranking = [p for p in pairs if p.ranking_only]
    pairs = [p for p in pairs if not p.ranking_only]
    if cfg.require_text:
        n0 = len(ranking)
        ranking = [p for p in ranking if p.patient_id in patients and p.trial_id in trials]
        if n0 > len(ranking):
            dropped["score 0 without note or criteria text"] = n0 - len(ranking)
        kept = []
        for p in pairs:
            if p.patient_id not in patients:
                problems.append(
                    f"{p.source}: pair '{p.pair_id}': no note for patient '{p.patient_id}' in "
                    f"{Path(cfg.patients).name}"
                )
            elif p.trial_id not in trials:
                problems.append(
                    f"{p.source}: pair '{p.pair_id}': no criteria text for trial '{p.trial_id}' in the "
                    "trials files"
                )
            else:
                kept.append(p)
        pairs = kept
    before = None
    if cfg.sample is not None:
        before = len(pairs)
        pairs = sample_pairs(pairs, cfg.sample)
    if not pairs:
        raise BenchError(
            f"the dataset has no usable pairs ({cfg.kind}: {cfg.pairs})"
            + (": " + "; ".join(problems[:5]) if problems else "")
        )
    used_p = {p.patient_id for p in pairs}
    ranking = [p for p in ranking if p.patient_id in used_p]  # the topics scored (after sampling)
    used_t = {p.trial_id for p in pairs + ranking}
    return BenchDataset(
        kind=cfg.kind,
        pairs=pairs,
        patients={k: v for k, v in patients.items() if k in used_p},
        trials={k: v for k, v in trials.items() if k in used_t},
        problems=problems,
        dropped=dropped,
        before_sampling=before,
        data_class=cfg.data_class,
        ranking_pairs=ranking,
    )
