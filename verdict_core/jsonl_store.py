"""An append-only JSONL record store with torn-tail repair: the one way the project keeps work that
a killed run must not lose (bench pairs, batch match results, student eval predictions).

    store = JsonlStore(path, PairResult)
    done = store.load()                    # complete, valid lines in file order (store.problems: the rest)
    with store:                            # opening for append first cuts a torn last line
        store.append(record)               # one line, flushed (and fsynced when durable=True)

A process killed between two writes leaves at most one torn line: the bytes after the file's last
newline. Reading ignores it; opening for append truncates the file to its last newline, so the next
record starts on a line of its own instead of being glued to the torn one (which would lose both).
A complete line that does not read as a record (a hand edit, another format) is reported in
``problems`` (file name and line number, never its content: records can carry patient text) and
skipped; it stays in the file. Records are appended, never rewritten: which of several lines for
one key counts is the caller's rule (`latest` keeps the last).

Deterministic and LLM-free, so every part may import it (train, bench and serve do).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

R = TypeVar("R", bound=BaseModel)


class JsonlStore(Generic[R]):
    """One JSONL file of ``model`` records. Thread-safe appends; one writer process per file."""

    def __init__(
        self, path: str | Path, model: type[R], *, durable: bool = False, exclude_defaults: bool = False
    ):
        self.path = Path(path)
        self.model = model
        self.durable = durable  # fsync after every append: a power loss keeps what was acknowledged
        self.exclude_defaults = exclude_defaults
        self.problems: list[str] = []
        self.torn_tail = False  # whether the last load or open found a torn last line
        self._lock = threading.Lock()
        self._sink = None

    # -- reading ---------------------------------------------------------------------------------
    def load(self) -> list[R]:
        """Every complete line that reads as a record, in file order (a torn tail is left out)."""
        self.problems = []
        self.torn_tail = False
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        self.torn_tail = end != len(data)
        out: list[R] = []
        for n, raw in enumerate(data[:end].split(b"\n")[:-1], 1):
            if not raw.strip():
                continue
            try:
                out.append(self.model.model_validate_json(raw))
            except (ValidationError, ValueError):
                self.problems.append(
                    f"{self.path.name}:{n}: unreadable record line ignored (its work is redone)"
                )
        return out

    def latest(self, key: Callable[[R], Hashable]) -> dict:
        """key -> the last record with that key (reruns append, so the last line is the newest)."""
        return {key(r): r for r in self.load()}

    # -- writing ---------------------------------------------------------------------------------
    def repair(self) -> bool:
        """Cut a torn last line (bytes after the last newline); True if there was one."""
        if not self.path.exists():
            return False
        size = self.path.stat().st_size
        with open(self.path, "r+b") as f:
            if size == 0:
                return False
            # Scan back from the end for the last newline; a torn line is short, so few reads.
            pos, keep = size, 0
            while pos > 0:
                step = min(pos, 1 << 16)
                pos -= step
                f.seek(pos)
                i = f.read(step).rfind(b"\n")
                if i >= 0:
                    keep = pos + i + 1
                    break
            if keep == size:
                return False
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        self.torn_tail = True
        return True

    def open(self) -> JsonlStore[R]:
        """Open for appending (after repairing a torn tail); idempotent."""
        with self._lock:
            if self._sink is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.repair()
                self._sink = open(self.path, "a", encoding="utf-8")
        return self

    def append(self, record: R) -> None:
        self.append_many([record])

    def append_many(self, records: Iterable[R]) -> None:
        """Append records as one write, flushed (fsynced when durable)."""
        text = "".join(r.model_dump_json(exclude_defaults=self.exclude_defaults) + "\n" for r in records)
        if not text:
            return
        if self._sink is None:
            self.open()
        with self._lock:
            self._sink.write(text)
            self._sink.flush()
            if self.durable:
                os.fsync(self._sink.fileno())

    def close(self) -> None:
        with self._lock:
            if self._sink is not None:
                self._sink.close()
                self._sink = None

    def __enter__(self) -> JsonlStore[R]:
        return self.open()

    def __exit__(self, *_exc) -> None:
        self.close()
