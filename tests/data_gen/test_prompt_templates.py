"""Versioned prompt templates: a changed wording needs a new version (LOCK.json pins each hash)."""

import pytest
from verdict.data_gen.formalizer.errors import ConfigError
from verdict.data_gen.formalizer.prompt_templates import (
    STAGE_TEMPLATE,
    available,
    current_hashes,
    load_prompt,
    lock,
)


def test_every_template_version_is_locked():
    # If this fails you edited a prompt in place: copy it to a new version file (v2, ...) and add
    # that version to LOCK.json. Old versions stay, so old cache entries and datasets stay meaningful.
    assert current_hashes() == lock()


def test_every_stage_has_a_template():
    names = available()
    for template in list(STAGE_TEMPLATE.values()) + ["repair"]:
        assert "v1" in names[template]


@pytest.mark.parametrize("name", sorted(available()))
def test_templates_render_with_exactly_their_slots(name):
    t = load_prompt(name, "v1")
    msgs = t.render(**{s: f"<{s}>" for s in t.slots})
    text = "\n".join(m["content"] for m in msgs)
    assert "{{" not in text and all(f"<{s}>" in text for s in t.slots)
    with pytest.raises(ConfigError, match="slots missing"):
        t.render()


def test_values_are_not_expanded_again():
    t = load_prompt("miner_inclusion", "v1")
    msgs = t.render(NOTE="note says {{ATOMS}}", ATOMS="a1")
    assert "note says {{ATOMS}}" in msgs[1]["content"]


def test_unknown_version_names_the_known_ones():
    with pytest.raises(ConfigError, match="trial_parser.v1"):
        load_prompt("trial_parser", "v9")
