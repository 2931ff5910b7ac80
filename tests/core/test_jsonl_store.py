"""The JSONL record store (verdict_core/jsonl_store.py): torn-tail repair, resume, problems."""

from __future__ import annotations

import threading

from pydantic import BaseModel
from verdict.core.jsonl_store import JsonlStore


class Rec(BaseModel):
    id: str
    n: int = 0


def torn(path, *complete: Rec, partial: Rec) -> None:
    """What a process killed between two writes leaves: complete lines, then part of the next one."""
    line = partial.model_dump_json() + "\n"
    path.write_text("".join(r.model_dump_json() + "\n" for r in complete) + line[: len(line) // 2])


def test_a_torn_last_line_is_ignored_then_cut_and_the_resumed_run_keeps_every_record(tmp_path):
    path = tmp_path / "records.jsonl"
    r1, r2, r3 = Rec(id="r1"), Rec(id="r2", n=2), Rec(id="r3", n=3)
    torn(path, r1, partial=r2)
    store = JsonlStore(path, Rec)
    assert store.load() == [r1] and store.torn_tail and store.problems == []
    with store:  # the resumed run redoes r2, then does r3
        store.append(r2)
        store.append(r3)
    assert JsonlStore(path, Rec).load() == [r1, r2, r3]
    assert path.read_text().count("\n") == 3  # no glued line left behind


def test_an_unreadable_complete_line_is_reported_by_number_without_its_content(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(
        Rec(id="a").model_dump_json()
        + '\n{"id": "secret patient text", "n": "x"}\n\n'
        + Rec(id="b").model_dump_json()
        + "\n"
    )
    store = JsonlStore(path, Rec)
    assert [r.id for r in store.load()] == ["a", "b"] and not store.torn_tail
    assert store.problems == ["records.jsonl:2: unreadable record line ignored (its work is redone)"]
    assert store.repair() is False  # a complete bad line is kept: the store never rewrites records


def test_latest_keeps_the_last_line_of_a_key_and_append_many_is_one_write(tmp_path):
    store = JsonlStore(tmp_path / "sub" / "r.jsonl", Rec, durable=True)
    store.append_many([Rec(id="a", n=1), Rec(id="b", n=1)])
    store.append(Rec(id="a", n=2))
    store.close()
    assert {k: r.n for k, r in store.latest(lambda r: r.id).items()} == {"a": 2, "b": 1}


def test_concurrent_appends_never_interleave(tmp_path):
    store = JsonlStore(tmp_path / "r.jsonl", Rec).open()
    threads = [
        threading.Thread(target=lambda i=i: [store.append(Rec(id=f"{i}-{j}", n=j)) for j in range(50)])
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert len(store.load()) == 200 and store.problems == []


def test_a_file_without_any_newline_is_all_torn_tail(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "r1"')
    store = JsonlStore(path, Rec)
    assert store.load() == [] and store.repair() is True and path.read_bytes() == b""
