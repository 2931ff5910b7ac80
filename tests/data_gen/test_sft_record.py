"""The one SFT record format: what the exports and the tiny students write is what train/ reads."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from verdict.data_gen.sft_record import TASKS, SftRecord, features, target

PROMPT = [{"role": "system", "content": "You translate criteria."}, {"role": "user", "content": "Age >= 18"}]


def test_a_record_from_a_call_is_the_row_train_reads():
    rec = SftRecord.of_call(
        PROMPT,
        '{"in_scope":false,"reason":"x"}',
        task="parser",
        record_id="r:parser:T#inc-1",
        trial_id="T",
        stage="parser",
        teacher="t",
        prompt_version="v1",
    )
    row = rec.row()
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert target(row) == '{"in_scope":false,"reason":"x"}'
    assert "provenance" not in row and row["patient_id"] is None
    assert set(row) == set(features())  # the row's columns are exactly the dataset's
    assert SftRecord.model_validate(row) == rec


def test_provenance_is_a_column_only_for_review_exports():
    rec = SftRecord.of_call(
        PROMPT,
        "{}",
        task="value_miner",
        record_id="r",
        trial_id="T",
        patient_id="P",
        stage="miner_inclusion",
        teacher="t",
        prompt_version="v1",
        provenance=json.dumps({"roles": ["review"]}),
    )
    assert set(rec.row()) == set(features(with_provenance=True))


@pytest.mark.parametrize("bad", [{"task": "arbiter"}, {"stage": None}, {"extra": 1}])
def test_a_malformed_record_is_refused_naming_the_field(bad):
    row = SftRecord.of_call(
        PROMPT,
        "{}",
        task="parser",
        record_id="r",
        trial_id="T",
        stage="parser",
        teacher="t",
        prompt_version="v1",
    ).row()
    with pytest.raises(ValidationError) as e:
        SftRecord.model_validate({**row, **bad})
    assert next(iter(bad)) in str(e.value)


def test_one_task_list_everywhere():
    from verdict.bench import recipe
    from verdict.data_gen import export
    from verdict.serve import students
    from verdict.train import sft_config

    assert TASKS == ("parser", "value_miner")
    assert export.TASKS is TASKS and students.TASKS is TASKS and sft_config.TASKS is TASKS
    assert recipe.TASKS is TASKS
