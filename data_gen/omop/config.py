"""Where an OMOP CDM database is and what is read from it (`OmopConfig`, a YAML file or flags).

The connection URL (`postgresql://USER@HOST:PORT/DB`) carries no password: it comes from the
environment variable `password_env` (default VERDICT_OMOP_PASSWORD) or from libpq's own PGPASSWORD /
~/.pgpass. The cohort ids the write-back may use are a range the site sets (`cohort_ids`), apart
from the ids its ATLAS assigns.
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator
from verdict.core.configs import StrictModel
from verdict.data_gen.formalizer import SourceEgress

from .errors import OmopSourceError

PASSWORD_ENV = "VERDICT_OMOP_PASSWORD"
_SCHEMA = r"^[a-z_][a-z0-9_]{0,62}$"


class CohortIdRange(StrictModel):
    """The cohort_definition_ids Verdict may use: a block the site keeps apart from its ATLAS ids."""

    first: int = Field(ge=1, le=2**31 - 1, description="lowest id (cohort_definition_id is an integer)")
    last: int = Field(ge=1, le=2**31 - 1, description="highest id")

    @model_validator(mode="after")
    def _ordered(self):
        if self.first > self.last:
            raise ValueError(f"first {self.first} is above last {self.last}")
        return self


class OmopConfig(StrictModel):
    url: str = Field(description="postgresql://USER@HOST[:PORT]/DATABASE (no password)")
    cdm_schema: str = Field("cdm", pattern=_SCHEMA, description="schema of the CDM tables")
    results_schema: str = Field(
        "results", pattern=_SCHEMA, description="schema of the `cohort` table the write-back fills"
    )
    vocabulary_schema: str | None = Field(
        None,
        pattern=_SCHEMA,
        description="schema of the `concept` table (default: cdm_schema); its rows name each concept's "
        "LOINC/SNOMED/RxNorm code and each unit's UCUM code",
    )
    password_env: str | None = Field(
        PASSWORD_ENV, description="environment variable with the password (unset: libpq's PGPASSWORD/.pgpass)"
    )
    connect_timeout_s: int = Field(10, ge=1, le=600, description="seconds to wait for the connection")
    cohort_id: int | None = Field(None, description="read only the persons of this cohort (results.cohort)")
    person_ids: list[int] | None = Field(None, min_length=1, description="read only these person_ids")
    batch_size: int = Field(500, ge=1, le=100000, description="persons read per query round")
    cohort_ids: CohortIdRange | None = Field(
        None, description="the ids the cohort write-back may use (required to write)"
    )
    egress: SourceEgress

    @field_validator("url")
    @classmethod
    def _postgres(cls, v: str) -> str:
        if not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("the OMOP database URL must start with postgresql://")
        return v

    @model_validator(mode="after")
    def _one_population(self):
        if self.cohort_id is not None and self.person_ids is not None:
            raise ValueError("give cohort_id or person_ids, not both")
        return self

    @property
    def vocabulary(self) -> str:
        return self.vocabulary_schema or self.cdm_schema

    def password(self) -> str | None:
        return os.environ.get(self.password_env) if self.password_env else None


def load_omop_config(path: os.PathLike | None, url: str, **overrides) -> OmopConfig:
    """The config from a YAML file (optional) with `url` and the flags given set over it."""
    from verdict.core import configs

    data = configs.read_yaml(path, OmopSourceError) if path is not None else {}
    data["url"] = url
    data.update({k: v for k, v in overrides.items() if v is not None})
    return configs.build(OmopConfig, data, where="OMOP config", error=OmopSourceError)


def read_person_ids(path: os.PathLike) -> list[int]:
    """person_ids from a file: one integer per line (blank lines and `#` comments skipped)."""
    from pathlib import Path

    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise OmopSourceError(f"{p.name}: cannot be read ({type(e).__name__})") from None
    ids, bad = [], []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if text.isdigit() and int(text) < 2**63:
            ids.append(int(text))
        else:
            bad.append(f"line {n}: not a person_id (a whole number)")
    if bad:
        raise OmopSourceError(f"{p.name}: person ids", bad)
    if not ids:
        raise OmopSourceError(f"{p.name}: no person id")
    return ids
