"""How every `verdict` command reports bad input: one line `error: ...` and an exit code, never a
traceback. Shared by the CLI modules of all parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer

from .errors import VerdictError

T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def guarded(
    fn: Callable[[], T], codes: dict[type[BaseException], int] | None = None, interrupted: str | None = None
) -> T:
    """Run a command (the `verdict` app runs every command through it): a VerdictError or an OS
    error becomes `error: ...` with exit 2; the exception types in ``codes`` get their own exit
    codes; Ctrl-C in a long run that says what was kept (``interrupted``) exits 130 with that."""
    try:
        return fn()
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        fail(f"interrupted; {interrupted}", 130)
    except tuple(codes or ()) as e:  # type: ignore[misc]
        fail(str(e), next(c for t, c in (codes or {}).items() if isinstance(e, t)))
    except VerdictError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")
