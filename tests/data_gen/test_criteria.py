"""The deterministic criteria split (data_gen/formalizer/criteria.py), on the longest real trials."""

import pytest
from verdict.data_gen.formalizer.criteria import CriterionText, normalize_criterion, split_trial
from verdict.data_gen.formalizer.protocol import TrialDoc

from tests.support import BENCHMARKS, need


def words(text: str) -> list[str]:
    return "".join(ch if ch.isalnum() else " " for ch in text.lower()).split()


@pytest.fixture(scope="module")
def longest():
    need((BENCHMARKS / "trials.jsonl").exists(), "shared trials corpus")
    from verdict.data_gen.sources import load_trials

    trials = load_trials(BENCHMARKS / "trials.jsonl").items
    return sorted(trials, key=lambda t: -len(t.criteria_text()))[:5]


def test_longest_real_trials_lose_no_text(longest):
    for t in longest:
        split = split_trial(t)
        assert len(split.criteria) >= 9
        ids = [c.id for c in split.criteria]
        assert len(ids) == len(set(ids)) and ids[0] == "inc-1"
        assert all(
            c.text.strip() and not c.text.lower().startswith(("inclusion criteria", "exclusion criteria"))
            for c in split.criteria
        )
        # every word of the trial is in a criterion or a dropped heading, in order
        kept = [w for c in split.criteria for w in words(c.text)] + [
            w for h in split.headings for w in words(h)
        ]
        source = words(
            (t.inclusion or "") + " " + (t.exclusion or "") + " " + (t.criteria if not t.inclusion else "")
        )
        assert sorted(set(source) - set(kept)) == []
        # only heading lines are dropped: short labels, never a criterion's text
        assert all(len(words(h)) <= 4 for h in split.headings), split.headings


def test_bullets_numbers_wrapped_lines_and_paragraphs():
    t = TrialDoc(
        trial_id="T",
        inclusion=(
            "Inclusion Criteria:\n\n-  Have dementia or Parkinson's disease and are found to aspirate on "
            "thin liquid during a\nset of qualifying swallows.\n\n1. Age 18 years or older\n2) ECOG 0-1\n\n"
            "Paragraph criterion one.\n\n"
            "Short line one\nShort line two"
        ),
        exclusion="Exclusion Criteria:\n\n* Pregnancy\n\n-\n\n(a) Prior chemotherapy",
    )
    split = split_trial(t)
    assert [(c.id, c.text) for c in split.criteria] == [
        (
            "inc-1",
            "Have dementia or Parkinson's disease and are found to aspirate on thin liquid during a set of "
            "qualifying swallows.",
        ),
        ("inc-2", "Age 18 years or older"),
        ("inc-3", "ECOG 0-1"),
        ("inc-4", "Paragraph criterion one."),
        ("inc-5", "Short line one"),
        ("inc-6", "Short line two"),
        ("exc-1", "Pregnancy"),
        ("exc-2", "Prior chemotherapy"),
    ]
    assert split.headings == ["Inclusion Criteria:", "Exclusion Criteria:", "-"]


def test_unsplit_text_is_split_at_its_headings():
    t = TrialDoc(
        trial_id="T", criteria="Inclusion Criteria:\n\n- Adults\n\nExclusion Criteria:\n\n- Pregnancy\n- HIV"
    )
    assert [(c.id, c.side, c.text) for c in split_trial(t).criteria] == [
        ("inc-1", "inclusion", "Adults"),
        ("exc-1", "exclusion", "Pregnancy"),
        ("exc-2", "exclusion", "HIV"),
    ]
    plain = TrialDoc(
        trial_id="T", criteria="Men and women who were cigarette smokers and between the ages of 35 and 60."
    )
    assert [(c.id, c.side) for c in split_trial(plain).criteria] == [("inc-1", "inclusion")]


def test_labels_prefix_their_items_and_lead_ins_group_an_any_of_list():
    t = TrialDoc(
        trial_id="T",
        inclusion=(
            "DISEASE CHARACTERISTICS:\n\n- Histologically confirmed melanoma\n\nAge:\n\n- 18 and over\n\n"
            "At least one of the following:\n\n- HIV seropositive\n\n- KSHV seropositive"
        ),
    )
    split = split_trial(t)
    assert [c.text for c in split.criteria] == [
        "Histologically confirmed melanoma",
        "Age: 18 and over",
        "At least one of the following:\n- HIV seropositive\n- KSHV seropositive",
    ]
    assert split.headings == ["DISEASE CHARACTERISTICS:"]


def test_a_criterion_over_budget_is_split_at_sentences_never_cut():
    long = " ".join(f"Sentence number {i} says something about the patient." for i in range(12))
    t = TrialDoc(trial_id="T", inclusion=long, exclusion="Pregnancy")
    fits = lambda c: len(c.text) <= 200  # noqa: E731
    split = split_trial(t, fits)
    parts = [c for c in split.criteria if c.side == "inclusion"]
    assert [c.id for c in parts][:2] == ["inc-1.1", "inc-1.2"] and len(parts) > 2
    assert " ".join(c.text for c in parts) == long and all(fits(c) for c in parts)
    assert split.oversize == []
    # one sentence that cannot fit is kept whole and reported
    huge = TrialDoc(trial_id="T", inclusion="x" * 500)
    s = split_trial(huge, fits)
    assert [c.text for c in s.criteria] == ["x" * 500] and s.oversize == ["inc-1"]


def test_an_over_budget_group_is_split_at_its_items_with_its_lead_in():
    items = "\n\n".join(f"- Condition number {i} of a long list" for i in range(10))
    t = TrialDoc(trial_id="T", inclusion=f"One of the following:\n\n{items}")
    split = split_trial(t, lambda c: len(c.text) <= 120)
    assert len(split.criteria) > 1 and split.split_groups == ["inc-1"]
    assert all(c.text.startswith("One of the following:\n- Condition") for c in split.criteria)


def test_lists_of_independent_requirements_become_one_criterion_per_item():
    items = "\n\n".join(f"- Condition {i}" for i in range(3))
    # any item of an exclusion list excludes: one criterion each, the lead-in kept as context
    exc = split_trial(TrialDoc(trial_id="T", exclusion=f"Ineligible if presenting any of:\n\n{items}"))
    assert [c.text for c in exc.criteria] == [
        f"Ineligible if presenting any of:\n- Condition {i}" for i in range(3)
    ]
    assert exc.distributed_groups == 1
    # items that only exclude together, or alternatives for inclusion, stay one criterion
    for doc in (
        TrialDoc(trial_id="T", exclusion=f"Two or more of the following:\n\n{items}"),
        TrialDoc(trial_id="T", inclusion=f"At least one of the following:\n\n{items}"),
        TrialDoc(trial_id="T", inclusion=f"Either of the following:\n\n{items}"),
    ):
        s = split_trial(doc)
        assert len(s.criteria) == 1 and s.distributed_groups == 0
    inc = split_trial(TrialDoc(trial_id="T", inclusion=f"Must meet all of the following:\n\n{items}"))
    assert len(inc.criteria) == 3 and inc.criteria[2].id == "inc-3"


def test_request_normalization():
    assert normalize_criterion("  Age   18\n\n or  older ") == "Age 18\nor older"
    assert normalize_criterion("ALT < 2x ULN", case=True) == "alt < 2x uln"
    assert CriterionText("inc-1", "inclusion", "x").side == "inclusion"
