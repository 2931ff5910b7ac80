"""Token limits in one place (configs/limits), the real Qwen2.5 counter, and `verdict teacher budget`."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml
from verdict.data_gen.formalizer.budget import (
    QWEN25_SIZE,
    LimitsError,
    StudentLimits,
    load_limits,
    qwen25_counter,
    qwen_tiktoken_ranks,
    render_chat,
)

from tests.support import REPO

SHARED = REPO.parent / "shared" / "data"
needs_shared = pytest.mark.skipif(
    not (SHARED / "reference" / "v6").is_dir(), reason="shared corpora not here"
)


def _limits_file(tmp_path, **over) -> str:
    data = {
        "max_length": 4096,
        "max_new_tokens": 3072,
        "tokenizer": "qwen2.5",
        "max_tokens": {"parser": 2048, "miner_inclusion": 1536, "miner_exclusion": 1536},
        **over,
    }
    p = tmp_path / "lim.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


# ---- the limits model ------------------------------------------------------------------------------
def test_shipped_limits_load_and_give_prompt_budgets():
    paper = load_limits("paper")
    assert (paper.max_length, paper.max_new_tokens, paper.tokenizer) == (4096, 3072, "qwen2.5")
    assert paper.prompt_budget("parser") == 4096 - paper.stage_tokens("parser")
    assert load_limits("cpu-tiny").max_length == 4096


def test_limits_errors_name_the_field(tmp_path):
    with pytest.raises(LimitsError, match=r"unknown config key 'max_lenght' \(did you mean 'max_length'\?\)"):
        load_limits(_limits_file(tmp_path, max_lenght=1))
    with pytest.raises(LimitsError, match=r"max_tokens.parser \(4000\) exceed max_new_tokens \(3072\)"):
        load_limits(
            _limits_file(tmp_path, max_tokens={"parser": 4000, "miner_inclusion": 1, "miner_exclusion": 1})
        )
    with pytest.raises(LimitsError, match=r"max_new_tokens \(4096\) must be below max_length \(4096\)"):
        load_limits(_limits_file(tmp_path, max_new_tokens=4096))
    with pytest.raises(LimitsError, match="no limits config named 'papr'"):
        load_limits("papr")


def test_train_serve_and_teacher_configs_derive_from_limits():
    from verdict.data_gen.formalizer.endpoint_config import load_teacher
    from verdict.serve.config import load_serve_config
    from verdict.train.eval_config import load_eval_config
    from verdict.train.sft_config import load_train_config

    paper = load_limits("paper")
    train = load_train_config(REPO / "configs" / "train" / "parser.yaml")
    assert train.limits == "paper" and train.max_length == paper.max_length
    assert load_eval_config(REPO / "configs" / "train" / "eval.yaml").max_new_tokens == paper.max_new_tokens
    assert load_eval_config(None, ["limits=paper"]).max_new_tokens == paper.max_new_tokens
    serve = load_serve_config("gpu-qwen7b")
    f = serve.api.formalizer
    assert serve.vllm.max_model_len == paper.max_length == f.context_tokens
    assert (f.max_tokens.parser, f.max_tokens.miner_exclusion, f.tokenizer) == (
        paper.max_tokens.parser,
        paper.max_tokens.miner_exclusion,
        "qwen2.5",
    )
    ep = f.endpoint("parser", "http://127.0.0.1:8011/v1")
    assert (ep.context_tokens, ep.tokenizer) == (4096, "qwen2.5")
    teacher = load_teacher("vllm-student-value-miner")
    assert (teacher.max_tokens.miner_inclusion, teacher.context_tokens, teacher.tokenizer) == (
        1536,
        4096,
        "qwen2.5",
    )
    # cpu-tiny counts with the served tiny model's own tokenizer, wherever the demo puts it
    tiny = load_serve_config("cpu-tiny", ["vllm.model=somewhere/student-base"])
    assert tiny.api.formalizer.tokenizer == tiny.vllm.model and tiny.vllm.model.endswith(
        "/somewhere/student-base"
    )


def test_a_contradicting_value_is_an_error_naming_both(tmp_path):
    from verdict.core.configs import ConfigError
    from verdict.data_gen.formalizer.endpoint_config import load_teacher
    from verdict.serve.config import load_serve_config
    from verdict.train.sft_config import load_train_config

    with pytest.raises(ConfigError, match=r"max_length: 8192 contradicts limits 'paper' \(4096\)"):
        load_train_config(REPO / "configs" / "train" / "parser.yaml", ["max_length=8192"])
    with pytest.raises(Exception, match=r"vllm.max_model_len: 16384 contradicts limits 'paper' \(4096\)"):
        load_serve_config("gpu-qwen7b", ["vllm.max_model_len=16384"])
    with pytest.raises(
        Exception, match=r"api.formalizer.max_tokens.parser: 4096 contradicts limits 'paper' \(2560\)"
    ):
        load_serve_config("gpu-qwen7b", ["api.formalizer.max_tokens.parser=4096"])
    p = tmp_path / "t.yaml"
    p.write_text(
        "name: t\nbase_url: http://127.0.0.1:8000/v1\nmodel: parser\nlimits: paper\ncontext_tokens: 16384\n"
    )
    with pytest.raises(Exception, match=r"context_tokens: 16384 contradicts limits 'paper' \(4096\)"):
        load_teacher(p)
    # the same value again is no contradiction
    p.write_text(
        "name: t\nbase_url: http://127.0.0.1:8000/v1\nmodel: parser\nlimits: paper\ncontext_tokens: 4096\n"
    )
    assert load_teacher(p).context_tokens == 4096


# ---- the real Qwen2.5 tokenizer ---------------------------------------------------------------------
def _real_texts() -> list[str]:
    texts = [
        "你好，世界！这是一个测试。",
        "Grüße, café naïve résumé — “quotes” 😀🚀 1234567",
        "  leading   spaces\n\n\ttabs\r\n",
        '{"a": [1, 2.5e-3, null], "b": "x\\ny"}',
        "e\u0301 (NFC)",
    ]
    if (SHARED / "benchmarks").is_dir():
        for name, keys in (
            ("trials.jsonl", ("inclusion", "exclusion")),
            ("patients_trec2021.jsonl", ("text",)),
        ):
            with open(SHARED / "benchmarks" / name, encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if i >= 150:
                        break
                    row = json.loads(line)
                    texts += [row[k] for k in keys if row.get(k)]
    return texts


def test_qwen25_counter_matches_tiktoken_on_real_texts():
    import tiktoken
    from verdict.data_gen.formalizer.budget import QWEN_SPLIT

    counter = qwen25_counter()
    assert counter._tok.get_vocab_size() == QWEN25_SIZE
    enc = tiktoken.Encoding(
        "qwen", pat_str=QWEN_SPLIT, mergeable_ranks=qwen_tiktoken_ranks(), special_tokens={}
    )
    texts = _real_texts()
    import unicodedata

    bad = [t[:40] for t in texts if counter.encode(t) != enc.encode_ordinary(unicodedata.normalize("NFC", t))]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ, e.g. {bad[:3]}"
    assert len(texts) > 5 or not (SHARED / "benchmarks").is_dir()


def test_chat_counts_equal_the_qwen25_template():
    pytest.importorskip("transformers")
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template
    from verdict.data_gen.formalizer.budget import qwen25_tokenizer_file

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(qwen25_tokenizer_file()), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = qwen2_5_chat_template
    counter = qwen25_counter()
    for msgs in (
        [{"role": "system", "content": "Return JSON."}, {"role": "user", "content": "\n\n{x}  "}],
        [{"role": "user", "content": "Hi"}],
    ):  # no system message: the template adds Qwen's
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert render_chat(msgs) == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        assert counter.count_messages(msgs) == len(ids)


# ---- the report ---------------------------------------------------------------------------------------
@needs_shared
def test_budget_report_last_line_on_a_small_corpus(tmp_path):
    from typer.testing import CliRunner
    from verdict.data_gen.cli import app

    ref = tmp_path / "ref"
    for f in sorted((SHARED / "reference" / "v6").glob("*/*__full.json"))[:3]:
        (ref / f.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(f, ref / f.parent.name / f.name)
    trials = tmp_path / "trials.jsonl"
    trials.write_text("".join(open(SHARED / "benchmarks" / "trials.jsonl", encoding="utf-8").readlines()[:5]))
    notes = tmp_path / "notes.jsonl"
    notes.write_text(
        "".join(open(SHARED / "benchmarks" / "patients_sigir.jsonl", encoding="utf-8").readlines()[:3])
    )
    args = [
        "budget",
        "--recorded",
        str(ref),
        "--trials",
        str(trials),
        "--notes",
        str(notes),
        "--note-tokens",
        "500",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    m = re.fullmatch(
        r"budget: records=(\d+) fit=1\.000 parser_fit=1\.000 miner_fit=1\.000 max_prompt=(\d+) "
        r"max_completion=(\d+) max_length=4096 new_tokens=3072",
        last,
    )
    assert m, last
    assert int(m[1]) > 20 and 0 < int(m[2]) <= 4096 - 1536
    assert "| trials | parser |" in r.output and "| notes-500 | miner_inclusion |" in r.output
    # tight limits: the same corpus no longer fits, and the report says so
    tight = _limits_file(
        tmp_path,
        max_length=1024,
        max_new_tokens=512,
        max_tokens={"parser": 64, "miner_inclusion": 512, "miner_exclusion": 512},
    )
    r = CliRunner().invoke(app, [*args[:-2], "--note-tokens", "", "--limits", tight])
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    fit = float(re.search(r" fit=([\d.]+)", last)[1])
    parser_fit = float(re.search(r"parser_fit=([\d.]+)", last)[1])
    assert parser_fit < 1.0 and fit < 1.0 and "max_length=1024 new_tokens=512" in last


def test_student_limits_model_is_strict():
    with pytest.raises(Exception, match="extra"):
        StudentLimits(
            max_length=100,
            max_new_tokens=10,
            tokenizer="qwen2.5",
            max_tokens={"parser": 1, "miner_inclusion": 1, "miner_exclusion": 1, "arbiter": 1},
        )
