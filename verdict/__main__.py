"""`python -m verdict` is the `verdict` command."""

from verdict.cli import main

main()
