"""The hash chain of the audit store: every row, trials, decisions and screenings alike, has a place
`seq` in one sequence (1, 2, 3, ...) and carries the hash of the row before it and of its own content.

    row_hash = sha256(canonical JSON of {"table": ..., every column but row_hash})

`prev_hash` is one of those columns, so changing, removing or reordering any row breaks every link
after it. The chain has no secret: whoever can write the file can recompute it from the changed row
on. A head recorded elsewhere (`verdict serve audit verify` prints it; `--head SEQ:HASH` checks it
later) closes that gap, and also catches rows removed from the end.

Columns added by a later schema (the decisions' `parent_id`, `lineage_json`, schema 3) are hashed
only when set: a row written before they existed reads them as NULL and keeps its hash, and a set
value (a lineage) is covered like any other column.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

GENESIS = "sha256:" + "0" * 64
TABLES = ("trials", "decisions", "screenings")  # screenings: schema 4
ADDED_COLUMNS = frozenset({"parent_id", "lineage_json"})  # hashed only when not NULL (see above)


def row_hash(table: str, columns: dict[str, Any]) -> str:
    content = {k: v for k, v in columns.items() if k != "row_hash" and not (k in ADDED_COLUMNS and v is None)}
    content["table"] = table
    data = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def link(table: str, columns: dict[str, Any], head: tuple[int, str] | None) -> dict[str, Any]:
    """`columns` as the next row after `head` (seq, row_hash of the newest row; None when empty)."""
    seq, prev = (head[0] + 1, head[1]) if head else (1, GENESIS)
    row = {**columns, "seq": seq, "prev_hash": prev}
    row["row_hash"] = row_hash(table, row)
    return row


@dataclass
class ChainReport:
    """What `verify` found: `problems` is empty when the chain is intact."""

    rows: dict[str, int] = field(default_factory=lambda: {t: 0 for t in TABLES})
    head: tuple[int, str] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def head_text(self) -> str:
        return f"{self.head[0]}:{self.head[1]}" if self.head else "0:" + GENESIS


def describe(table: str, row: dict[str, Any]) -> str:
    ident = row.get("decision_id") or row.get("screening_id") or row.get("trial_id")
    return f"{table} row seq {row.get('seq')}" + (f" ({ident})" if ident else "")


def check_chain(
    rows: Iterable[tuple[str, dict[str, Any]]], report: ChainReport, head: str | None = None
) -> ChainReport:
    """Walk (table, row) in seq order; stop at the first bad row and name it. `head` (SEQ:HASH, as
    verify printed it earlier) must still be a row of the chain, with that hash."""
    want = _parse_head(head, report) if head else None
    expected_seq, prev, found = 1, GENESIS, None
    for table, row in rows:
        report.rows[table] += 1
        where = describe(table, row)
        if row["seq"] != expected_seq:
            what = "missing or deleted" if row["seq"] > expected_seq else "duplicated or reordered"
            report.problems.append(f"{where}: expected seq {expected_seq} (rows {what})")
            return report
        if row["prev_hash"] != prev:
            report.problems.append(
                f"{where}: prev_hash does not match the row before it (deleted or reordered)"
            )
            return report
        if row_hash(table, row) != row["row_hash"]:
            report.problems.append(f"{where}: content does not match its row_hash (rewritten)")
            return report
        if want and row["seq"] == want[0]:
            found = row["row_hash"]
        report.head = (row["seq"], row["row_hash"])
        expected_seq, prev = row["seq"] + 1, row["row_hash"]
    if want and want[0] > 0:
        if found is None:
            report.problems.append(f"recorded head seq {want[0]} is no longer in the store (rows removed)")
        elif found != want[1]:
            report.problems.append(
                f"row seq {want[0]}: its hash differs from the recorded head (chain rewritten)"
            )
    return report


def _parse_head(text: str, report: ChainReport) -> tuple[int, str] | None:
    seq_text, _, expected = text.partition(":")
    if not seq_text.isdigit() or not expected.startswith("sha256:"):
        report.problems.append(f"--head '{text}': expected SEQ:sha256:HEX, as verify prints it")
        return None
    return int(seq_text), expected


def merge_by_seq(tables: dict[str, Iterator[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of several tables, each already in seq order, as one sequence in seq order."""

    def tagged(table: str, rows: Iterator[dict[str, Any]]):
        for r in rows:
            yield r["seq"], table, r

    streams = [tagged(t, rows) for t, rows in tables.items()]
    for _seq, table, row in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
        yield table, row
