"""What the audit store costs per decision (chained append, synchronous=FULL on SQLite) and how fast
`verify` walks the chain, on SQLite and, with --postgres, on a PostgreSQL database.

    .venv/bin/python benchmarks/audit_store.py [--rows 2000] [--writers 4]
        [--postgres postgresql://USER@HOST:PORT/DB --password-env VAR]

Printed: appends/s with one writer and with --writers threads (each its own store, as API replicas
are), median and p99 milliseconds per append, and verify rows/s. Decisions carry a ~6 kB artifact,
about what a real match stores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
ARTIFACT = {"decision": {"criteria": [{"id": f"inc{i}", "status": "satisfied", "text": "x" * 200}
                                      for i in range(25)]}}  # fmt: skip


def append(store) -> float:
    t0 = time.perf_counter()
    store.add_decision(
        created_by="bench", trial_id="T1", program_hash="sha256:aa", patient_id="P1", note_hash="sha256:bb",
        patient_hash="sha256:cc", policy_name="prescreen", policy_version="1", engine_version="1",
        decision="eligible", models={"value_miner": "value_miner"}, timings={"total": 1.0},
        artifacts=ARTIFACT, note_text="A 58-year-old woman with type 2 diabetes.",
    )  # fmt: skip
    return time.perf_counter() - t0


def measure(label: str, open_store, rows: int, writers: int) -> None:
    store = open_store()
    lat = [append(store) for _ in range(rows)]
    one = rows / sum(lat)
    lat.sort()
    stores = [open_store() for _ in range(writers)]
    per = rows // writers
    t0 = time.perf_counter()
    threads = [threading.Thread(target=lambda s=s: [append(s) for _ in range(per)]) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    many = per * writers / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    report = store.verify()
    dt = time.perf_counter() - t0
    n = sum(report.rows.values())
    assert report.ok, report.problems
    print(f"{label:<10} append: {one:7.0f}/s (1 writer)  {many:7.0f}/s ({writers} writers)  "
          f"median {statistics.median(lat) * 1000:.2f} ms  p99 {lat[int(len(lat) * 0.99)] * 1000:.2f} ms  |  "
          f"verify: {n} rows in {dt:.2f} s ({n / dt:.0f} rows/s)")  # fmt: skip
    for s in [store, *stores]:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--postgres", help="a postgresql:// URL of an empty database to write to")
    ap.add_argument("--password-env", help="environment variable with its password (default: PGPASSWORD)")
    args = ap.parse_args()
    from verdict.serve.audit import AuditStore

    with tempfile.TemporaryDirectory(prefix="audit-bench-") as d:
        path = Path(d) / "audit.sqlite"
        measure("sqlite", lambda: AuditStore(path), args.rows, args.writers)
    if args.postgres:
        measure("postgresql", lambda: AuditStore(args.postgres, password_env=args.password_env),
                args.rows, args.writers)  # fmt: skip


if __name__ == "__main__":
    main()
