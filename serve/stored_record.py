"""The patient record as the audit store keeps it, and read back.

A decision row keeps the patient text (`note_text`, only under `store_notes: true`) and, always, the
SHA-256 of that text (`note_hash`): a single `note` as it was sent, several documents as the JSON list
[{"id", "text"}] (their dates and kinds are in the `documents` artifact, without text). A
re-derivation that reads the chart again (serve/reviews/reading.py) rebuilds the record from the
stored text, or checks that a record sent again hashes to `note_hash`.
"""

from __future__ import annotations

import hashlib
import json

from verdict.data_gen.formalizer import SINGLE_NOTE_ID, NoteDocument, PatientDoc

from .audit import DecisionRow


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def stored_record(note: str | None, record: PatientDoc) -> str:
    """The patient text as the audit store keeps it: a single `note` as is; several documents as the
    JSON list [{"id", "text"}] (the decision's `documents` artifact says which)."""
    if note is not None:
        return note
    docs = [{"id": d.id, "text": d.text} for d in record.note_documents()]
    return json.dumps(docs, ensure_ascii=False, separators=(",", ":"))


def record_hash(note: str | None, record: PatientDoc) -> str:
    """The `note_hash` a decision on this record keeps."""
    return sha256_text(stored_record(note, record))


def documents_meta(note: str | None, record: PatientDoc) -> list[dict] | None:
    """The documents of a `notes` request (ids, dates, kinds, hashes; no text); None for a `note`."""
    if note is not None:
        return None
    return [
        {"id": d.id, "date": d.date, "kind": d.kind, "sha256": sha256_text(d.text)}
        for d in record.note_documents()
    ]


def stored_documents(row: DecisionRow) -> list[dict]:
    """The stored patient text as documents [{id, text}]: a `notes` request stored them as a JSON
    list (its `documents` artifact says so); a single note is the one document 'note'."""
    if row.note_text is None:
        return []
    if row.artifacts.get("documents") is not None:
        return [{"id": str(d["id"]), "text": str(d["text"])} for d in json.loads(row.note_text)]
    return [{"id": SINGLE_NOTE_ID, "text": row.note_text}]


def stored_chart(row: DecisionRow) -> PatientDoc | None:
    """The record the decision was made on, rebuilt from the store (dates and kinds from the
    `documents` artifact); None when the store keeps no text (`store_notes: false`)."""
    docs = stored_documents(row)
    if not docs:
        return None
    meta = {str(m.get("id")): m for m in row.artifacts.get("documents") or [] if isinstance(m, dict)}
    documents = []
    for d in docs:
        m = meta.get(d["id"], {})
        documents.append(NoteDocument(id=d["id"], text=d["text"], date=m.get("date"), kind=m.get("kind")))
    return PatientDoc(patient_id=row.patient_id, documents=documents)
