"""Patients from FHIR R4: a Bundle file, a Bulk Data NDJSON folder or a REST server, read into one
internal record (`FhirPatientRecord`: the miner's documents plus coded facts), and the atoms that
coded facts resolve deterministically (`resolve_coded`). See docs/fhir.md.

Modules: `sources` (bundle / NDJSON), `rest` (REST client behind the egress allowlist), `validate`
(fhir.resources R4B models), `extract` (documents and facts), `records` (one record per patient),
`units` (UCUM conversions), `code_map` (configs/fhir/codes.yaml), `resolve`, `cli`.
"""
