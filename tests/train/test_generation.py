"""Batched greedy generation (verdict.train.generation): left padding must not change any output."""

import pytest
from verdict.train.generation import Generator
from verdict.train.run_dir import RunDir
from verdict.train.sft_config import TrainConfig


@pytest.mark.slow
def test_batched_outputs_equal_one_by_one(tiny_value_miner_run, sft_export_dir):
    from datasets import load_from_disk

    run = RunDir(tiny_value_miner_run)
    base = TrainConfig.model_validate(run.read_config()).base_model
    rows = load_from_disk(str(sft_export_dir / "value_miner"))["train"].to_list()
    gen = Generator(base, str(run.adapter), device="cpu", max_new_tokens=96)
    convs = [r["messages"] for r in rows]
    lengths = {len(gen.tokenizer(gen.prompt_text(c))["input_ids"]) for c in convs}
    assert len(lengths) > 1  # the batch really needs padding
    batched = gen.generate(convs)
    single = [gen.generate([c])[0] for c in convs]
    assert [g.text for g in batched] == [g.text for g in single]
    assert all(g.batch_size == len(convs) and g.seconds > 0 for g in batched)
    # a stop token ends each output and is counted, but is not part of the text
    assert all(g.new_tokens == len(gen.tokenizer(g.text)["input_ids"]) + 1 for g in single)


def test_prompt_is_system_and_user_with_the_assistant_header(tiny_model_dir):
    gen = Generator(str(tiny_model_dir), None, device="cpu", max_new_tokens=4)
    text = gen.prompt_text(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "SECRET ANSWER"},
        ]
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
