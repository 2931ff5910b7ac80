"""The one shape of a progress callback: every long job takes ``progress=``, a function that gets
one line of text (what is done, what is left). The CLI passes stderr; tests pass a list's append."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str], None]


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def silent(_line: str) -> None:
    pass
