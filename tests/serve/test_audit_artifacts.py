"""The decision record's artifacts as a type (issue 25): rows written before it had a schema version
load, keep every key, and still render; what the writers store now carries the version.

`tests/fixtures/decision_artifacts_v0.json` holds the artifacts of a match and of a review exactly as
the service wrote them before the type existed (a real service, scripted formalizer)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from verdict.core.program import load_program
from verdict.serve.audit import AuditStore
from verdict.serve.audit.artifacts import ARTIFACTS_SCHEMA, DecisionArtifacts, typed_artifacts
from verdict.serve.clinician_page import render_page

from tests.serve.test_reviews import program
from tests.support import REPO

OLD = json.loads((REPO / "tests/fixtures/decision_artifacts_v0.json").read_text())


@pytest.fixture
def old_store(tmp_path):
    """A store holding the rows the old writers made (their artifacts verbatim)."""
    store = AuditStore(str(tmp_path / "audit.sqlite"))
    rows = {}
    for kind, parent in (("match", None), ("review", "match")):
        rows[kind] = store.add_decision(
            created_by="k", trial_id="T-REVIEW", program_hash="sha256:" + "a" * 64, patient_id="P1",
            note_hash="sha256:n", patient_hash="sha256:p", policy_name="prescreen", policy_version="1",
            engine_version="e", decision=OLD[kind]["decision"]["decision"], models={}, timings={},
            artifacts=OLD[kind], note_text="Patient is 45 years old. Creatinine 3.1 mg/dL on admission.",
            parent_id=rows[parent].decision_id if parent else None,
            lineage={"kind": "review", "parent_id": rows[parent].decision_id, "changes": []}
            if parent else None,
        )  # fmt: skip
    yield store, rows
    store.close()


def test_rows_written_before_the_type_load_keep_every_key_and_render(old_store):
    store, rows = old_store
    for kind, written in rows.items():
        row = store.decision(written.decision_id)
        typed = DecisionArtifacts.of(row.artifacts)
        assert typed.schema_version == 0 and typed.decision["decision"] == OLD[kind]["decision"]["decision"]
        stored = typed.stored()
        assert {k: stored[k] for k in OLD[kind]} == OLD[kind]  # nothing lost, extra keys included
        page = render_page(row, load_program(program()))
        assert row.decision_id in page and 'id="decision"' in page
    assert DecisionArtifacts.of(OLD["match"]).cost.mining.calls >= 0  # typed since it was written
    later = DecisionArtifacts.of({**OLD["match"], "a_later_field": [1]})
    assert later.model_extra == {"a_later_field": [1]} and later.stored()["a_later_field"] == [1]  # kept
    older = {k: v for k, v in OLD["match"].items() if k not in ("trial_version", "cost", "chart_read")}
    assert DecisionArtifacts.of(older).trial_version is None  # a row from before issue 22.5


def test_writers_store_the_current_version_and_refuse_a_malformed_record():
    new = typed_artifacts({k: v for k, v in OLD["review"].items()})
    assert new["schema_version"] == ARTIFACTS_SCHEMA == 1
    assert DecisionArtifacts.of(new).trial_version == DecisionArtifacts.of(OLD["review"]).trial_version
    with pytest.raises(ValidationError):
        typed_artifacts({**OLD["match"], "patient": "not a resolved patient"})
    with pytest.raises(ValidationError):
        typed_artifacts({k: v for k, v in OLD["match"].items() if k != "decision"})
