"""Trial programs by content hash, loaded from their audit rows once (the newest 256 kept)."""

from __future__ import annotations

from collections import OrderedDict

from verdict.core.program import TrialProgram, load_program

from .audit import TrialRow


class ProgramCache:
    def __init__(self, size: int = 256):
        self.size = size
        self._programs: OrderedDict[str, TrialProgram] = OrderedDict()

    def program_of(self, row: TrialRow) -> TrialProgram:
        program = self._programs.get(row.program_hash)
        if program is None:
            program = load_program(row.program_json)
            self._programs[row.program_hash] = program
            while len(self._programs) > self.size:
                self._programs.popitem(last=False)
        return program
