"""Plausibility of coded facts: a value no patient can have is refused, never observed.

The ranges are part of the site code map (configs/fhir/codes.yaml): each analyte's `plausible`
range is in its canonical unit, and `dates` bounds the reference date and the age a birth date
gives. A refused value is named by its resource and field, never quoted (it is patient data), and
the rest of the record loads.
"""

from __future__ import annotations

import datetime as dt

from pydantic import Field, model_validator
from verdict.core.configs import StrictModel

RANGE_SOURCE = "configs/fhir/codes.yaml"


class PlausibleRange(StrictModel):
    """The values a patient can have, in the analyte's canonical unit (bounds included)."""

    min: float = Field(description="lowest plausible value")
    max: float = Field(description="highest plausible value")

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        return self

    def problem(self, value: float, what: str, unit: str) -> str | None:
        """Why `value` is refused (without the value), or None."""
        if value < self.min:
            return f"{what} is below the plausible minimum {self.min:g} {unit} ({RANGE_SOURCE}); not used"
        if value > self.max:
            return f"{what} is above the plausible maximum {self.max:g} {unit} ({RANGE_SOURCE}); not used"
        return None


class PlausibleDates(StrictModel):
    """Bounds on the dates a record is read at and on the age a birth date gives."""

    max_age_years: int = Field(125, ge=1, description="a birth date giving an older age is refused")
    earliest_reference_date: dt.date = Field(
        dt.date(1900, 1, 1), description="a reference date before this is refused"
    )
    max_days_after_today: int = Field(
        366, ge=0, description="a reference date more than this many days after today is refused"
    )

    def reference_date_problem(self, day: dt.date, today: dt.date | None = None) -> str | None:
        latest = (today or dt.date.today()) + dt.timedelta(days=self.max_days_after_today)
        if day < self.earliest_reference_date:
            return f"before {self.earliest_reference_date.isoformat()}"
        if day > latest:
            return f"more than {self.max_days_after_today} days after today"
        return None

    def age_problem(self, oldest_age: int) -> str | None:
        if oldest_age > self.max_age_years:
            return f"gives an age over {self.max_age_years} years at the reference date ({RANGE_SOURCE})"
        return None
