"""Patients from a live OMOP CDM 5.4 database on PostgreSQL, read into the same internal record FHIR
gives (`verdict.data_gen.fhir.models.FhirPatientRecord`), and screening results written back into the
CDM results schema's `cohort` table. See docs/data_gen.md, "OMOP CDM".

Modules: `config` (connection, schemas, population, cohort id range), `connect` (egress allowlist and
credentials, before any connection), `records` (rows -> records, through the FHIR path's code map,
unit conversion and plausibility checks), `cohorts` (the write-back), `cli` (`verdict omop load`).
"""
