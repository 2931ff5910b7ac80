"""The content-addressed call cache and the ledger."""

import sqlite3

import pytest
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.cache import CachedCall, CallCache, CallMeta, canonical_key
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.errors import BudgetExhausted
from verdict.data_gen.formalizer.ledger import Ledger, estimate_prompt_tokens
from verdict.data_gen.formalizer.prompt_templates import PromptTemplate

from .teacher_data import trial

META = CallMeta(run="r", stage="parser", teacher="t", endpoint="openai:http://x", model="m", prompt="p@v1")


def teacher(**over):
    cfg = dict(name="t", base_url="http://127.0.0.1:9/v1", model="m")
    cfg.update(over)
    return EndpointConfig(**cfg)


def key(t=None, i=0, prompts=None):
    fz = Formalizer(t or teacher(), prompts=prompts)
    own = fz.trial_criteria(trial(i)).criteria[1]  # "Diagnosis of condition i": differs per trial
    return fz.request_key("parser", fz.criterion_messages(own), {"type": "object"}, "x")[0]


def test_the_same_criterion_in_two_trials_is_one_key():
    fz = Formalizer(teacher())
    a, b = (fz.trial_criteria(trial(i)).criteria[0] for i in (0, 1))  # "Adults aged 18 or older"
    assert (
        fz.request_key("parser", fz.criterion_messages(a), {"type": "object"}, "x")[0]
        == fz.request_key("parser", fz.criterion_messages(b), {"type": "object"}, "x")[0]
    )


def test_key_covers_endpoint_model_params_and_inputs():
    base = key()
    assert key() == base  # deterministic
    assert key(teacher(model="m2")) != base
    assert key(teacher(base_url="http://127.0.0.1:10/v1")) != base
    assert key(teacher(temperature=0.3)) != base
    assert key(teacher(max_tokens={"parser": 99})) != base
    assert key(teacher(extra_params={"reasoning_effort": "low"})) != base
    assert key(i=1) != base
    assert key(teacher(max_tokens={"miner_inclusion": 99})) == base  # another stage's setting


def test_key_covers_the_prompt_version(monkeypatch):
    base = key()
    real = Formalizer.prompt

    def reworded(self, stage):
        t = real(self, stage)
        return PromptTemplate(t.name, "v2", t.stage, t.system, t.user, "0" * 64)

    monkeypatch.setattr(Formalizer, "prompt", reworded)
    assert key() != base


def test_store_is_atomic_with_its_ledger_entry(tmp_path):
    c = CallCache(tmp_path / "c.sqlite")
    call = CachedCall(
        key="k1", content="{}", finish_reason="stop", prompt_tokens=10, completion_tokens=5, cost_usd=0.5
    )
    c.begin("k1", META)
    assert c.inflight("r") == [("k1", "r", "parser")]
    c.store(call, META)
    assert c.get("k1") == call and c.inflight("r") == [] and c.spent("r") == 0.5
    c.record_hit(call, META)
    kinds = {x["kind"]: x for x in c.ledger_summary("r")}
    assert kinds["paid"]["calls"] == 1 and kinds["cache_hit"]["cost_usd"] == 0
    c.close()
    db = sqlite3.connect(tmp_path / "c.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_crash_before_the_answer_leaves_a_journal_entry(tmp_path):
    c = CallCache(tmp_path / "c.sqlite")
    c.begin("k2", META)
    c.close()  # the process dies here
    c = CallCache(tmp_path / "c.sqlite")
    assert c.inflight("r") == [("k2", "r", "parser")] and c.get("k2") is None
    assert c.clear_inflight("r") == 1


def test_canonical_key_ignores_dict_order():
    assert canonical_key({"a": 1, "b": [1, {"c": 2, "d": 3}]}) == canonical_key(
        {"b": [1, {"d": 3, "c": 2}], "a": 1}
    )


def test_ledger_reserves_worst_case_and_stops(tmp_path):
    c = CallCache(tmp_path / "c.sqlite")
    c.store(
        CachedCall(
            key="old", content="", finish_reason="stop", prompt_tokens=0, completion_tokens=0, cost_usd=0.4
        ),
        META,
    )
    led = Ledger(c, "r", budget_usd=1.0)
    assert led.spent == 0.4  # money spent before a restart counts
    a = led.reserve(0.3)
    with pytest.raises(BudgetExhausted, match=r"\$0.4000 spent of \$1.0000"):
        led.reserve(0.35)  # 0.4 + 0.3 reserved + 0.35 > 1.0
    assert led.stopped
    led.settle(a, 0.1)
    with pytest.raises(BudgetExhausted):
        led.reserve(0.01)  # once stopped, stays stopped: no item starts after the stop
    assert led.spent == pytest.approx(0.5)
    unlimited = Ledger(c, "r")
    unlimited.settle(unlimited.reserve(1e9), None)


def test_prompt_token_estimate_is_conservative():
    text = "A 58-year-old African-American woman presents to the ER with episodic chest pain. " * 20
    # real BPE vocabularies need about 1 token per 4 bytes of English; the estimate must not be below that
    assert estimate_prompt_tokens([{"role": "user", "content": text}]) >= len(text) / 4
