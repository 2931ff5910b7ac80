"""SFT dataset checks, fingerprints and weighted mixing (verdict.train.sft_data) on export-format fixtures."""

import shutil

import pytest
from verdict.train import sft_data
from verdict.train.sft_data import DatasetError

from tests.fixtures.sft import compact, miner_rows, parser_row, write_task


def test_checked_load_of_a_good_export(sft_export_dir):
    splits = sft_data.load_checked(sft_export_dir / "value_miner", "value_miner", ["train", "test"])
    assert len(splits["train"]) == 8 and len(splits["test"]) == 4


def test_wrong_task_is_refused_by_the_card_and_by_the_rows(sft_export_dir, tmp_path):
    with pytest.raises(DatasetError, match="is a 'parser' dataset .* this run is for task 'value_miner'"):
        sft_data.load_checked(sft_export_dir / "parser", "value_miner", ["train"])
    # without a card the rows themselves give it away
    copy = tmp_path / "parser"
    shutil.copytree(sft_export_dir / "parser", copy)
    (copy / "dataset_card.json").unlink()
    with pytest.raises(DatasetError, match="holds 'parser' records but this run is for task 'value_miner'"):
        sft_data.load_checked(copy, "value_miner", ["train"])


def test_rows_that_do_not_fit_the_schema_are_listed_by_record_id(tmp_path):
    good = miner_rows("P1", "NCT0001")
    bad = miner_rows("P2", "NCT0002")
    bad[0]["messages"][2]["content"] = compact({"values": [{"atom": "age_years", "value": "old"}]})
    bad[1]["messages"][2]["content"] = "{not json"
    write_task(tmp_path, "value_miner", {"train": good + bad})
    with pytest.raises(DatasetError) as e:
        sft_data.load_checked(tmp_path / "value_miner", "value_miner", ["train"])
    msg = str(e.value)
    assert (
        "miner_inclusion:NCT0002:P2: assistant output is not a valid ValueMinerOutput (values.0.value" in msg
    )
    assert "miner_exclusion:NCT0002:P2: assistant output is not a valid ValueMinerOutput" in msg
    assert "NCT0001" not in msg


def test_parser_output_must_be_a_parsed_trial(tmp_path):
    row = parser_row("NCT0001")
    row["messages"][2]["content"] = compact({"atoms": [], "cohorts": []})
    write_task(tmp_path, "parser", {"train": [row]})
    with pytest.raises(DatasetError, match="parser:NCT0001: assistant output is not a valid ParsedTrial"):
        sft_data.load_checked(tmp_path / "parser", "parser", ["train"])


def test_wrong_conversation_shape_and_missing_columns(tmp_path):
    row = parser_row("NCT0001")
    row["messages"] = row["messages"][1:]
    write_task(tmp_path / "a", "parser", {"train": [row]})
    with pytest.raises(DatasetError, match=r"messages have roles \['user', 'assistant'\]"):
        sft_data.load_checked(tmp_path / "a" / "parser", "parser", ["train"])
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list([{"text": "hello"}])}).save_to_disk(str(tmp_path / "plain"))
    with pytest.raises(DatasetError, match=r"missing column\(s\) messages, task, record_id"):
        sft_data.load_checked(tmp_path / "plain", "parser", ["train"])


def test_missing_folder_split_and_non_dataset(sft_export_dir, tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        sft_data.load_checked(tmp_path / "nope", "parser", ["train"])
    with pytest.raises(DatasetError, match="has no split 'holdout'"):
        sft_data.load_checked(sft_export_dir / "parser", "parser", ["holdout"])
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("x")
    with pytest.raises(DatasetError, match="is not a saved DatasetDict"):
        sft_data.load_checked(tmp_path / "junk", "parser", ["train"])


def test_fingerprint_follows_content_not_location(sft_export_dir, tmp_path):
    a = sft_data.load_checked(sft_export_dir / "parser", "parser", ["train"])["train"]
    shutil.copytree(sft_export_dir / "parser", tmp_path / "copy")
    b = sft_data.load_checked(tmp_path / "copy", "parser", ["train"])["train"]
    assert sft_data.fingerprint(a) == sft_data.fingerprint(b)
    rows = a.to_list()
    rows[0]["messages"][2]["content"] = rows[0]["messages"][2]["content"].replace("18", "19")
    write_task(tmp_path / "edited", "parser", {"train": rows})
    c = sft_data.load_checked(tmp_path / "edited" / "parser", "parser", ["train"])["train"]
    assert sft_data.fingerprint(c) != sft_data.fingerprint(a)


def test_weighted_mixing(sft_export_dir):
    assert sft_data.weighted_indices(4, 1.0, 0) == [0, 1, 2, 3]
    assert sft_data.weighted_indices(4, 2.0, 0) == [0, 1, 2, 3, 0, 1, 2, 3]
    half = sft_data.weighted_indices(4, 0.5, 0)
    assert len(half) == 2 and len(set(half)) == 2
    assert half == sft_data.weighted_indices(4, 0.5, 0)  # seeded
    d = sft_data.load_checked(sft_export_dir / "value_miner", "value_miner", ["train", "test"])
    mixed = sft_data.mix([(d["train"], 0.5), (d["test"], 3.0)], seed=0)
    assert len(mixed) == 4 + 12 and mixed.column_names == ["messages"]
    assert list(mixed.select(range(4, 16))["messages"]) == list(d["test"]["messages"]) * 3
