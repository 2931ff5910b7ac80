"""Errors of the OMOP source. Messages name tables, row ids, schemas and hosts, never row content."""

from __future__ import annotations

from verdict.core.errors import VerdictError


class OmopSourceError(VerdictError):
    """The OMOP database cannot be read (refused URL, connection failure, missing table)."""


class CohortWriteError(VerdictError):
    """The cohort write-back is refused or failed (nothing of this run was written)."""
