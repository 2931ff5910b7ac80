"""The internal patient record made from FHIR (and from an OMOP CDM, `verdict.data_gen.omop`): the
miner's documents plus coded facts.

`documents` are exactly what the value miner reads
(`verdict.data_gen.formalizer.protocol.NoteDocument`); `facts` are the coded resources (Condition,
Observation, MedicationStatement/Request, Procedure), each naming its resource (`Observation/123`;
an OMOP row: `measurement/123`). Problems name resources by `Type/id` and fields by path, never by
content."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from verdict.core.configs import StrictModel
from verdict.data_gen.formalizer import NoteDocument, PatientDoc

RECORD_FORMAT = "verdict.fhir_patient/v1"
FactCategory = Literal["condition", "observation", "medication", "procedure"]


class Coding(StrictModel):
    system: str | None = Field(None, description="code system URI (http://loinc.org, ...)")
    code: str | None = None
    display: str | None = None


class FactConversion(StrictModel):
    """The fact's value in its analyte's canonical unit (configs/fhir/codes.yaml)."""

    value: float = Field(description="value in the canonical unit")
    unit: str = Field(description="canonical UCUM unit")
    rule: str = Field(description="how it was converted: same unit, scale, molar mass ..., IFCC-NGSP ...")


class CodedFact(StrictModel):
    """One coded resource (or one component of an Observation) as a structured fact."""

    resource: str = Field(description="the resource it comes from, Type/id (e.g. Observation/123)")
    category: FactCategory
    component: int | None = Field(None, description="index in Observation.component, for panel components")
    codings: list[Coding] = Field(default_factory=list, description="every coding of the resource's code")
    text: str | None = Field(None, description="CodeableConcept.text, if any")
    canonical: str | None = Field(
        None, description="canonical fact name from the code map, if a code is mapped"
    )
    value: float | str | bool | None = Field(
        None, description="Observation value (quantity value, string, bool)"
    )
    unit: str | None = Field(
        None, description="the value's UCUM code as the resource gives it (or its unit text)"
    )
    converted: FactConversion | None = Field(
        None, description="the value in the canonical unit of `canonical`"
    )
    conversion_problem: str | None = Field(None, description="why the value could not be converted")
    refused: str | None = Field(
        None, description="why the value was refused (outside its analyte's plausible range); value is unset"
    )
    effective: str | None = Field(None, description="effective / onset / authored date or datetime, ISO")
    status: str | None = Field(None, description="status (Observation.status, clinicalStatus, ...)")

    @property
    def code(self) -> Coding | None:
        return self.codings[0] if self.codings else None


class FhirPatientRecord(StrictModel):
    """One patient as read from FHIR, at a stated reference date."""

    format: Literal["verdict.fhir_patient/v1"] = RECORD_FORMAT
    patient_id: str = Field(description="Patient resource id (OMOP: the person_id)")
    patient_source: str | None = Field(
        None,
        pattern=r"^[A-Za-z_]{1,40}/[A-Za-z0-9._-]{1,64}$",
        description="what the birth date and gender come from when it is not Patient/{patient_id} "
        "(an OMOP record: person/{person_id})",
    )
    reference_date: str = Field(description="the date ages are computed at (ISO), as the caller stated it")
    birth_date: str | None = Field(None, description="Patient.birthDate as given (may be YYYY or YYYY-MM)")
    gender: str | None = Field(None, description="Patient.gender (administrative gender)")
    age_years: int | None = Field(None, description="full years at reference_date (exact birth date only)")
    age_range: tuple[int, int] | None = Field(None, description="possible ages when birthDate is partial")
    documents: list[NoteDocument] = Field(default_factory=list, description="the notes, one per resource")
    facts: list[CodedFact] = Field(default_factory=list)
    problems: list[str] = Field(
        default_factory=list, description="per resource: Type/id: field path: problem"
    )

    @property
    def patient_ref(self) -> str:
        """The resource or row the birth date and gender come from (evidence of the age)."""
        return self.patient_source or f"Patient/{self.patient_id}"

    def patient_doc(self) -> PatientDoc | None:
        """The documents as the miner's input (None when the patient has no document)."""
        if not self.documents:
            return None
        return PatientDoc(patient_id=self.patient_id, documents=list(self.documents))

    def conversions(self) -> list[CodedFact]:
        return [f for f in self.facts if f.converted is not None and f.converted.rule != "same unit"]
