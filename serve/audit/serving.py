"""The audit view of one decision (`GET /v1/decisions/{id}`): its row, as the API shows it."""

from __future__ import annotations

from ..errors import NotFound
from ..quote_hash import quote_hashing
from ..trial_versions import TrialVersion
from .protocol import DecisionRecord
from .store import AuditStore, DecisionRow


def decision_row(audit: AuditStore, decision_id: str) -> DecisionRow:
    row = audit.decision(decision_id)
    if row is None:
        raise NotFound(f"no decision '{decision_id}'")
    return row


def decision_record(audit: AuditStore, decision_id: str) -> DecisionRecord:
    r = decision_row(audit, decision_id)
    return DecisionRecord(
        decision_id=r.decision_id,
        created_at=r.created_at,
        created_by=r.created_by,
        trial_id=r.trial_id,
        program_hash=r.program_hash,
        patient_id=r.patient_id,
        note_sha256=r.note_hash,
        patient_hash=r.patient_hash,
        policy={"name": r.policy_name, "version": r.policy_version},
        engine_version=r.engine_version,
        decision=r.decision,
        models=r.models,
        timings_ms=r.timings,
        artifacts=r.artifacts,
        note_stored=r.note_text is not None,
        trial_version=TrialVersion.recorded(r.artifacts),
        quote_hashing=quote_hashing(r.artifacts),
        parent_id=r.parent_id,
        lineage=r.lineage,
    )
