"""One library warning the project causes, silenced exactly where it causes it: peft reads
transformers' deprecated `is_gradient_checkpointing` each time it wraps a model (`PeftModel`, and
the SFT trainer's `get_peft_model`), and transformers 5 answers with a FutureWarning every time.
Nothing else is filtered, and nowhere else: the project's own progress lines are untouched."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

DEPRECATED_CHECKPOINTING = r"`is_gradient_checkpointing` is deprecated"


@contextmanager
def peft_quietly() -> Iterator[None]:
    """Inside: that one FutureWarning is not shown (any other warning is)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DEPRECATED_CHECKPOINTING, category=FutureWarning)
        yield
