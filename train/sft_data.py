"""SFT datasets as `verdict teacher export` writes them: checks, fingerprints, weighted mixing.

Layout: ``<out>/<task>/`` holds a ``DatasetDict.save_to_disk`` (splits train / validation / test)
whose rows are ``messages`` (system, user, assistant), ``task``, ``record_id``, ``trial_id``,
``patient_id``, ``stage``, ``teacher``, ``prompt_version``; the assistant content is the compact
JSON the student must emit. Everything is checked before a single step is paid for.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError
from verdict.core.errors import VerdictError
from verdict.core.patient import ValueMinerOutput
from verdict.core.program import ParsedCriterion, ParsedTrial
from verdict.data_gen.sft_record import ROLES

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

REQUIRED_COLUMNS = ("messages", "task", "record_id")
MAX_LISTED = 10


class DatasetError(VerdictError):
    """An SFT dataset is missing, of the wrong task, or its rows do not fit the task's schema."""


def output_model(task: str, content: str | dict | None = None) -> type[BaseModel]:
    """What the student of ``task`` emits (the assistant content). The parser works per criterion
    (`ParsedCriterion`, an object with `in_scope`); older parser records hold a whole `ParsedTrial`:
    given the content, the model that fits its shape."""
    if task == "parser" and content is not None and is_criterion_output(content):
        return ParsedCriterion
    if task == "reader":
        from verdict.data_gen.formalizer import ReaderOutput

        return ReaderOutput
    return {"parser": ParsedTrial, "value_miner": ValueMinerOutput}[task]


def adapter_tasks(task: str) -> tuple[str, ...]:
    """The dataset tasks a run of `task` trains on (the value miner's adapter also reads charts)."""
    from verdict.data_gen.sft_record import ADAPTER_TASKS

    return ADAPTER_TASKS.get(task, (task,))


def is_criterion_output(content: str | dict) -> bool:
    """A per-criterion parser output (it has `in_scope`), not a whole ParsedTrial."""
    if isinstance(content, dict):
        return "in_scope" in content
    try:
        obj = json.loads(content)
    except ValueError:
        return False
    return isinstance(obj, dict) and "in_scope" in obj


def load_dataset_dict(path: str | Path) -> DatasetDict:
    from datasets import DatasetDict, load_from_disk

    p = Path(path)
    if not p.is_dir():
        raise DatasetError(
            f"dataset '{p}' does not exist (expected a folder written by `verdict teacher export`)"
        )
    try:
        dd = load_from_disk(str(p))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise DatasetError(
            f"dataset '{p}' is not a saved DatasetDict ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    if not isinstance(dd, DatasetDict):
        raise DatasetError(
            f"dataset '{p}' is a single Dataset; expected a DatasetDict with train/validation/test splits"
        )
    return dd


def card_task(path: str | Path) -> str | None:
    card = Path(path) / "dataset_card.json"
    if not card.is_file():
        return None
    try:
        return json.loads(card.read_text()).get("task")
    except (ValueError, AttributeError):
        raise DatasetError(f"dataset '{path}': dataset_card.json is not a JSON object") from None


def check_split(ds: Dataset, task: str, where: str) -> None:
    """Every row: the right task, a system/user/assistant conversation, and an assistant message
    that is valid JSON of the task's output schema."""
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise DatasetError(
            f"{where}: missing column(s) {', '.join(missing)} (has: {', '.join(ds.column_names)}); "
            "is this an SFT dataset written by `verdict teacher export`?"
        )
    tasks = sorted(set(ds["task"]))
    wrong = [t for t in tasks if t not in adapter_tasks(task)]
    if wrong:
        raise DatasetError(f"{where}: holds '{', '.join(wrong)}' records but this run is for task '{task}'")
    problems: list[str] = []
    for i, row in enumerate(ds.select_columns(["messages", "record_id", "task"])):
        rid = row["record_id"] or f"row {i}"
        msgs = row["messages"] or []
        roles = [m.get("role") for m in msgs]
        if roles != ROLES:
            problems.append(f"{rid}: messages have roles {roles}, expected {ROLES}")
        elif not all(isinstance(m.get("content"), str) and m["content"] for m in msgs):
            problems.append(f"{rid}: a message has empty content")
        else:
            try:
                model = output_model(row["task"], msgs[2]["content"])
                model.model_validate_json(msgs[2]["content"])
            except ValidationError as e:
                first = e.errors(include_url=False, include_input=False)[0]
                loc = ".".join(str(x) for x in first["loc"]) or "output"
                problems.append(
                    f"{rid}: assistant output is not a valid {model.__name__} ({loc}: {first['msg']})"
                )
        if len(problems) >= MAX_LISTED:
            problems.append("... (stopped listing)")
            break
    if problems:
        raise DatasetError(f"{where}: rows do not fit task '{task}'", problems)


def load_checked(path: str | Path, task: str, splits: list[str]) -> dict[str, Dataset]:
    """The named splits of an exported dataset, checked for ``task`` (a missing split is an error)."""
    declared = card_task(path)
    if declared is not None and declared not in adapter_tasks(task):
        raise DatasetError(
            f"dataset '{path}' is a '{declared}' dataset (dataset_card.json) but this run is for "
            f"task '{task}'"
        )
    dd = load_dataset_dict(path)
    out = {}
    for s in splits:
        if s not in dd:
            raise DatasetError(f"dataset '{path}' has no split '{s}' (has: {', '.join(dd)})")
        check_split(dd[s], task, f"dataset '{path}' split '{s}'")
        out[s] = dd[s]
    return out


def fingerprint(ds: Dataset) -> str:
    """Content hash of a split (record ids and conversations, in order): stable across copies."""
    h = hashlib.sha256()
    for row in ds.select_columns(["record_id", "messages"]):
        h.update(json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        h.update(b"\n")
    return "sha256:" + h.hexdigest()


def weighted_indices(n: int, weight: float, seed: int) -> list[int]:
    """Each record floor(weight) times, plus a seeded sample of the fractional part."""
    whole, frac = int(weight), weight - int(weight)
    idx = [i for _ in range(whole) for i in range(n)]
    extra = round(frac * n)
    if extra:
        idx += sorted(random.Random(seed).sample(range(n), extra))
    return idx


def mixed_indices(sizes: list[tuple[int, float]], seed: int) -> list[list[int]]:
    """The rows of each (size, weight) dataset that every epoch of `mix` trains on: dataset k is
    sampled with seed + k, so a fractional weight replays the same seeded subset each epoch (the
    rows it leaves out are the ones a fine-tune may forget: check them with `verdict train eval`)."""
    return [weighted_indices(n, w, seed + k) for k, (n, w) in enumerate(sizes)]


def mix(parts: list[tuple[Dataset, float]], seed: int) -> Dataset:
    """One training set from several (dataset, weight) pairs; only ``messages`` is kept."""
    from datasets import concatenate_datasets

    pieces = []
    for (ds, _), idx in zip(parts, mixed_indices([(len(ds), w) for ds, w in parts], seed)):
        if idx:
            pieces.append(ds.select_columns(["messages"]).select(idx))
    if not pieces:
        raise DatasetError("the dataset weights select no training records")
    return concatenate_datasets(pieces) if len(pieces) > 1 else pieces[0]
