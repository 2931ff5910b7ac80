"""OMOP CDM 5.4 rows -> one `FhirPatientRecord` per person, at a stated reference date.

The same record, and the same rules, as the FHIR path (`verdict.data_gen.fhir`): the code map
(configs/fhir/codes.yaml), unit conversion (`fhir.units`) and plausibility checks (`fhir.extract.
checked_fact`) are those of FHIR, so a coded lab decides its atom without the miner, converted
explicitly or refused with the reason. Read per person:

- `person`: birth date (birth_datetime, else year/month/day of birth: a partial one gives an age
  range) and gender concept (8507 male, 8532 female); the age is taken at the reference date;
- `note`: note_text as a document `note/ID` (note_date, note_type_concept_id's name as its kind);
- `condition_occurrence`, `drug_exposure`, `procedure_occurrence`, `measurement`, `observation`:
  coded facts named by row (`measurement/123`). A concept is matched by its OMOP concept id and,
  when the database's `concept` table has its row, by its LOINC/SNOMED/RxNorm/ICD-10 code. A
  measurement's unit is its unit concept's UCUM code (the `concept` row, else the code map's
  `unit_concepts`), else unit_source_value. CDM rows are recorded results: status `final`.

A bad row is a problem naming its table, id and column, never its content; the other rows load.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from psycopg import sql
from verdict.core.formula import number_problem
from verdict.data_gen.formalizer import NoteDocument

from ..fhir.code_map import CodeMap
from ..fhir.extract import canonical_of, checked_fact
from ..fhir.models import CodedFact, Coding, FactCategory, FhirPatientRecord
from ..fhir.records import birth_fields

OMOP_SYSTEM = "https://fhir-terminology.ohdsi.org"  # the code map's `omop:` prefix: standard concept ids
VOCABULARIES = {
    "LOINC": "loinc",
    "SNOMED": "snomed",
    "RxNorm": "rxnorm",
    "ICD10": "icd10",
    "ICD10CM": "icd10cm",
}
GENDERS = {8507: "male", 8532: "female"}


@dataclass(frozen=True)
class FactTable:
    table: str
    category: FactCategory
    concept: str  # the *_concept_id column
    date: str  # the date the fact is effective
    values: bool = False  # value_as_number / unit columns (measurement, observation)
    value_string: bool = False  # value_as_string (observation)


FACT_TABLES = (
    FactTable("condition_occurrence", "condition", "condition_concept_id", "condition_start_date"),
    FactTable("drug_exposure", "medication", "drug_concept_id", "drug_exposure_start_date"),
    FactTable("procedure_occurrence", "procedure", "procedure_concept_id", "procedure_date"),
    FactTable("measurement", "observation", "measurement_concept_id", "measurement_date", values=True),
    FactTable(
        "observation", "observation", "observation_concept_id", "observation_date", True, value_string=True
    ),
)


@dataclass
class Person:
    person_id: int
    year: int | None
    month: int | None
    day: int | None
    birth_datetime: dt.datetime | None
    gender_concept_id: int | None
    documents: list
    facts: list
    problems: list


def _fact_query(t: FactTable, cdm: str, vocab: str) -> sql.Composed:
    values = (
        sql.SQL(
            ", t.value_as_number, {string}, t.unit_concept_id, t.unit_source_value, u.vocabulary_id, "
            "u.concept_code"
        ).format(string=sql.SQL("t.value_as_string" if t.value_string else "NULL::text"))
        if t.values
        else sql.SQL(", NULL::numeric, NULL::text, NULL::integer, NULL::text, NULL::text, NULL::text")
    )
    unit_join = (
        sql.SQL(" LEFT JOIN {v}.concept u ON u.concept_id = t.unit_concept_id").format(
            v=sql.Identifier(vocab)
        )
        if t.values
        else sql.SQL("")
    )
    return sql.SQL(
        "SELECT t.person_id, t.{id}, t.{concept}, t.{date}, c.vocabulary_id, c.concept_code, c.concept_name"
        "{values} FROM {cdm}.{table} t LEFT JOIN {v}.concept c ON c.concept_id = t.{concept}{unit_join} "
        "WHERE t.person_id = ANY(%s) ORDER BY t.person_id, t.{id}"
    ).format(
        id=sql.Identifier(f"{t.table}_id"),
        concept=sql.Identifier(t.concept),
        date=sql.Identifier(t.date),
        values=values,
        cdm=sql.Identifier(cdm),
        table=sql.Identifier(t.table),
        v=sql.Identifier(vocab),
        unit_join=unit_join,
    )


def _number(value, name: str, column: str, problems: list[str]) -> float | None:
    if value is None:
        return None
    number = float(value) if isinstance(value, Decimal) else value
    why = number_problem(number)
    if why:
        problems.append(f"{name}: {column}: {why}; not used")
        return None
    return number


def _unit(row: tuple, code_map: CodeMap) -> str | None:
    unit_concept_id, unit_source, unit_vocab, unit_code = row[9:13]
    if unit_vocab == "UCUM" and unit_code:
        return unit_code
    if unit_concept_id and unit_concept_id in code_map.unit_concepts:
        return code_map.unit_concepts[unit_concept_id]
    return unit_source.strip() if unit_source and unit_source.strip() else None


def fact_of(t: FactTable, row: tuple, code_map: CodeMap, problems: list[str]) -> CodedFact:
    """The coded fact of one row (person_id, id, concept, date, vocabulary, code, name, value columns)."""
    _, row_id, concept_id, day, vocabulary, code, display = row[:7]
    name = f"{t.table}/{row_id}"
    codings = []
    if concept_id:
        codings.append(Coding(system=OMOP_SYSTEM, code=str(concept_id), display=display))
    system = code_map.systems.get(VOCABULARIES.get(vocabulary or "", ""))
    if system and code:
        codings.append(Coding(system=system, code=code))
    found = canonical_of(code_map, codings)
    value = unit = None
    if t.values:
        value = _number(row[7], name, "value_as_number", problems)
        if value is None and row[7] is None and t.value_string and row[8]:
            value = row[8]
        unit = _unit(row, code_map)
    fact = checked_fact(
        CodedFact(
            resource=name,
            category=t.category,
            codings=codings,
            canonical=found[1] if found else None,
            value=value,
            unit=unit,
            effective=day.isoformat() if day is not None else None,
            status="final" if t.values else None,
        ),
        code_map,
        problems,
    )
    if fact.conversion_problem and fact.canonical:  # by column, never the unit text or the value
        unit_of = code_map.analytes[fact.canonical].unit
        problems.append(
            f"{name}: unit_concept_id/unit_source_value: the value cannot be converted to {fact.canonical}'s "
            f"unit {unit_of} (no UCUM unit known, or another dimension); not used"
        )
    return fact


def note_of(row: tuple, problems: list[str]) -> NoteDocument | None:
    _, note_id, text, day, kind = row
    name = f"note/{note_id}"
    text = (text or "").replace("\r\n", "\n").strip()
    if not text:
        problems.append(f"{name}: note_text is empty; no document")
        return None
    slug = "_".join((kind or "").lower().split())[:40] or None
    return NoteDocument(id=name, text=text, date=day.isoformat() if day is not None else None, kind=slug)


def birth_date(p: Person, problems: list[str]) -> str | None:
    """The birth date as precise as the row gives it (YYYY, YYYY-MM or YYYY-MM-DD)."""
    if p.birth_datetime is not None:
        return p.birth_datetime.date().isoformat()
    if p.year is None:
        return None
    if p.month is None:
        return f"{p.year:04d}"
    try:
        if p.day is None:
            dt.date(p.year, p.month, 1)
            return f"{p.year:04d}-{p.month:02d}"
        return dt.date(p.year, p.month, p.day).isoformat()
    except ValueError:
        problems.append(
            f"person/{p.person_id}: month_of_birth/day_of_birth: not a calendar date; only year_of_birth used"
        )
        return f"{p.year:04d}"


def record_of(p: Person, at: dt.date, code_map: CodeMap) -> FhirPatientRecord:
    problems = list(p.problems)
    birth = age = age_range = None
    given = birth_date(p, problems)
    if given is not None:
        birth, age, age_range = birth_fields(given, at, code_map, f"person/{p.person_id}: birth", problems)
    documents = sorted(p.documents, key=lambda d: (d.date or "", d.id))
    facts = sorted(p.facts, key=lambda f: (f.resource, -1 if f.component is None else f.component))
    return FhirPatientRecord(
        patient_id=str(p.person_id),
        patient_source=f"person/{p.person_id}",
        reference_date=at.isoformat(),
        birth_date=birth,
        gender=GENDERS.get(p.gender_concept_id or 0),
        age_years=age,
        age_range=age_range,
        documents=documents,
        facts=facts,
        problems=sorted(problems),
    )


def read_people(conn, ids: list[int], cdm: str, vocab: str, code_map: CodeMap) -> list[Person]:
    """The persons of `ids` that exist, with their notes and facts; bad rows as problems."""
    people: dict[int, Person] = {}
    query = sql.SQL(
        "SELECT person_id, year_of_birth, month_of_birth, day_of_birth, birth_datetime, gender_concept_id "
        "FROM {cdm}.person WHERE person_id = ANY(%s) ORDER BY person_id"
    ).format(cdm=sql.Identifier(cdm))
    for row in conn.execute(query, (ids,)):
        people[row[0]] = Person(*row, documents=[], facts=[], problems=[])
    if not people:
        return []
    found = list(people)
    notes = sql.SQL(
        "SELECT t.person_id, t.note_id, t.note_text, t.note_date, c.concept_name FROM {cdm}.note t "
        "LEFT JOIN {v}.concept c ON c.concept_id = t.note_type_concept_id "
        "WHERE t.person_id = ANY(%s) ORDER BY t.person_id, t.note_id"
    ).format(cdm=sql.Identifier(cdm), v=sql.Identifier(vocab))
    for row in conn.execute(notes, (found,)):
        p = people[row[0]]
        try:
            doc = note_of(row, p.problems)
        except Exception as e:  # noqa: BLE001 - one bad row never stops the others; named by id only
            p.problems.append(f"note/{row[1]}: not read ({type(e).__name__})")
            continue
        if doc is not None:
            p.documents.append(doc)
    for t in FACT_TABLES:
        for row in conn.execute(_fact_query(t, cdm, vocab), (found,)):
            p = people[row[0]]
            try:
                p.facts.append(fact_of(t, row, code_map, p.problems))
            except Exception as e:  # noqa: BLE001 - as above
                p.problems.append(f"{t.table}/{row[1]}: not read ({type(e).__name__})")
    return [people[i] for i in found]
