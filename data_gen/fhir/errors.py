"""Errors of the FHIR ingestion. Messages name resource ids, field paths and hosts, never content."""

from __future__ import annotations

from verdict.core.errors import VerdictError


class FhirSourceError(VerdictError):
    """A FHIR source (bundle file, NDJSON folder, server) cannot be read at all."""


class FhirServerError(FhirSourceError):
    """A FHIR server answered with an error or could not be reached."""


class CodeMapError(VerdictError):
    """The site code map (configs/fhir/codes.yaml) is malformed."""


class UnitConversionError(VerdictError):
    """A value cannot be converted between two units; the message gives the reason."""
