"""The SFT record: one row of an exported dataset, the one format every part writes and reads.

`verdict teacher export` (data_gen/export.py), the review export, the tiny students
(serve/students.py) write it; `train/sft_data.py` checks it, `train/eval.py` reads it. A row is one
stage call: the prompt the service sends (system, user) and, as the assistant turn, the compact
JSON the student must emit for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import Field
from verdict.core.configs import StrictModel

TASKS: tuple[str, ...] = ("parser", "value_miner")  # the student adapters, one per task
Task = Literal["parser", "value_miner"]
# The datasets an export writes: the chart reader's is a task of the value-miner adapter (the same
# kind of reading, served by it), exported apart so that each dataset holds one output format.
DATASET_TASKS: tuple[str, ...] = (*TASKS, "reader")
DatasetTask = Literal["parser", "value_miner", "reader"]
ADAPTER_TASKS: dict[str, tuple[str, ...]] = {"parser": ("parser",), "value_miner": ("value_miner", "reader")}
ROLES = ["system", "user", "assistant"]


class Message(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str


class SftRecord(StrictModel):
    messages: list[Message] = Field(description="system, user (the stage's prompt), assistant (the target)")
    task: DatasetTask
    record_id: str = Field(description="unique in the export: '<run>:<stage>:<trial>[:<patient>][#<item>]'")
    trial_id: str
    patient_id: str | None = Field(None, description="null for parser records")
    stage: str = Field(description="parser, miner_inclusion or miner_exclusion")
    teacher: str
    prompt_version: str
    provenance: str | None = Field(None, description="review exports only: JSON (roles, times, decision ids)")

    @classmethod
    def of_call(cls, prompt: list[dict[str, str]], target: str, **fields) -> SftRecord:
        """A record from a stage call's prompt messages and the output the student must give."""
        msgs = [Message(role=m["role"], content=m["content"]) for m in prompt]  # type: ignore[arg-type]
        return cls(messages=[*msgs, Message(role="assistant", content=target)], **fields)

    def row(self) -> dict:
        """The dataset row (no provenance column unless the record has one)."""
        return self.model_dump(exclude={"provenance"} if self.provenance is None else set())


def target(row: dict) -> str:
    """The assistant content of a row: what the student must emit."""
    return row["messages"][-1]["content"]


def features(with_provenance: bool = False):
    """The `datasets` column types of a row."""
    from datasets import Features, Value  # heavy optional dependency: datasets (teacher/train extra)

    text = Value("string")
    cols = {
        "messages": [{"role": text, "content": text}],
        **{
            k: text
            for k in ("task", "record_id", "trial_id", "patient_id", "stage", "teacher", "prompt_version")
        },
    }
    if with_provenance:
        cols["provenance"] = text
    return Features(cols)


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


@contextmanager
def datasets_quietly() -> Iterator[None]:
    """No `datasets` progress bars inside ("Saving the dataset" per split: a few small shards, the
    bars would only clutter the command's own progress lines); as they were after."""
    # heavy optional dependency: datasets (teacher/train extra)
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    was = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        yield
    finally:
        if was:
            enable_progress_bar()
