"""The append-only audit store: every trial program the service used, every decision it made, with
what an auditor needs to reproduce it (input hashes, program version, model and adapter ids,
policy version, timings, artifacts), and every screening run (its source, counts and decisions).

    from verdict.serve.audit import AuditStore
    store = AuditStore("runs/serve/audit.sqlite")            # SQLite (one node), see sqlite.py
    store = AuditStore("postgresql://verdict@db/verdict")    # PostgreSQL (replicas), see postgres.py
    store.verify().ok                                         # protections + hash chain (chain.py)

Append-only is enforced by the database itself, not by convention, and every row is linked into one
hash chain. This store is the one place the service keeps patient text (the note, so that the
clinician page can show evidence in context; `store_notes: false` keeps only its hash): it is the
clinical record, readable only with the audit role (a SQLite file is created with mode 0600).
"""

from . import postgres, sqlite  # noqa: F401 - the backends: each registers itself with AuditStore
from .chain import ChainReport
from .store import (
    ORIGIN_ROLE,
    REVIEWED_ORIGINS,
    AuditStore,
    DecisionRow,
    ScreeningRow,
    TrialRow,
    is_postgres_url,
    open_store,
)

__all__ = [
    "ORIGIN_ROLE",
    "REVIEWED_ORIGINS",
    "AuditStore",
    "ChainReport",
    "DecisionRow",
    "ScreeningRow",
    "TrialRow",
    "is_postgres_url",
    "open_store",
]
