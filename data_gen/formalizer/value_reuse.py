"""Mined values reused across trials: what the value miner found for one atom in one patient record
is asked again for no other trial (site-wide screening: one patient x hundreds of trials).

Key: the record (every document's id, date and text), the miner stage and its prompt version, the
model, and the atom's full declaration (name, domain, unit, kind, definition, time scope): the
same chart fact asked the same way. The per-criterion parser makes the same declaration for the
same criterion text, so trials that share criteria share their atoms' values. What is kept is the
atom's findings (every passage's value with its quote and document), so the merge that follows is
the one a fresh mining would make; an atom the miner found nothing for is kept too (no finding).

Concurrent trials of one patient (a screen runs pairs concurrently) share the mining in progress:
an atom another trial is asking about right now is waited for, not asked again. That mining runs as
its own task, cancelled only when no trial is left waiting for it (the cancellation of the trial
that started it does not cancel it); when it fails, the waiters ask for the atom themselves. In
memory only, bounded (least recently used out): it holds patient text (quotes) and never leaves
the process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verdict.core.program import Atom

    from .findings import Finding
    from .protocol import NoteDocument


def record_key(docs: list[NoteDocument], stage: str, prompt: str, model: str) -> str:
    body = json.dumps(
        [[d.id, getattr(d, "date", None), d.text] for d in docs] + [stage, prompt, model],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()


def atom_key(atom: Atom) -> str:
    body = json.dumps(
        atom.model_dump(mode="json", exclude={"source_criteria"}), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(body.encode()).hexdigest()


class SharedMining:
    """One trial's mining of the atoms it claimed, as its own task: every trial that needs those
    atoms awaits it (shielded), and it is cancelled only when no one is left waiting, so the
    cancellation of the trial that started it never takes the answer from the others."""

    def __init__(self, coro):
        self.task = asyncio.get_running_loop().create_task(coro)
        self.waiters = 0

    async def join(self):
        """The mining's answer. Raises MiningCancelled when the mining itself was cancelled (its
        waiters all left before this one came): ask yourself."""
        self.waiters += 1
        try:
            return await asyncio.shield(self.task)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():  # this waiter is being cancelled
                if self.waiters == 1 and not self.task.done():  # the last one: nobody needs the answer
                    self.task.cancel()
                raise
            raise MiningCancelled() from None
        finally:
            self.waiters -= 1


class MiningCancelled(Exception):
    """The shared mining a trial waited for was cancelled: that trial asks for the atoms itself."""


class ValueReuse:
    """The per-process store of mined findings (see the module docstring)."""

    def __init__(self, max_entries: int = 200_000):
        self.max_entries = max_entries
        self._done: OrderedDict[tuple[str, str], list[Finding]] = OrderedDict()
        self._pending: dict[tuple[str, str], SharedMining] = {}
        self.reused = 0  # atoms answered from the store or from another trial's mining
        self.asked = 0  # atoms sent to the miner

    def claim(
        self, record: str, atoms: list[Atom]
    ) -> tuple[dict[str, list[Finding]], dict[str, SharedMining], list[Atom]]:
        """(found: atom name -> findings, waiting: atom name -> another trial's mining in progress,
        to ask: the atoms this caller must mine; it passes them to `start` right away)."""
        found, waiting, ask = {}, {}, []
        for a in atoms:
            k = (record, atom_key(a))
            if k in self._done:
                self._done.move_to_end(k)
                found[a.name] = self._done[k]
            elif k in self._pending:
                waiting[a.name] = self._pending[k]
            else:
                ask.append(a)
        self.reused += len(found) + len(waiting)
        self.asked += len(ask)
        return found, waiting, ask

    def start(self, record: str, atoms: list[Atom], coro) -> SharedMining:
        """Run `coro` as the shared mining of these atoms: it returns an object with `findings` (atom
        name -> findings) and `rejected` (None when the mining succeeded); a success is kept."""
        shared = SharedMining(coro)
        keys = [(record, atom_key(a)) for a in atoms]
        for k in keys:
            self._pending[k] = shared

        def settle(task: asyncio.Task) -> None:
            ok = not task.cancelled() and task.exception() is None and task.result().rejected is None
            for a, k in zip(atoms, keys):
                if self._pending.get(k) is shared:
                    del self._pending[k]
                if ok:
                    self._done[k] = list(task.result().findings.get(a.name, []))
                    self._done.move_to_end(k)
            while len(self._done) > self.max_entries:
                self._done.popitem(last=False)

        shared.task.add_done_callback(settle)
        return shared
