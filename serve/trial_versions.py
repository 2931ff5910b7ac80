"""Which version of a trial a decision was made against, and whether that version decides.

A trial's active version is the one a match uses by default (verdict.serve.audit.store: a reviewed
upload or revision wins over parser output, then the newest). Pinning another version with
`program_hash` decides against a program that is not the trial's:

- a key with the trial_owner role (admin included) may do it, as a **preview** of that version;
- any other key gets 409 `inactive_version`, naming the active version;
- a batch pins each trial's active version when it starts, and a review re-derives against its
  decision's version (`pinned`): a version made inactive meanwhile still decides those;
- criteria text given inline is decided against its own parse (`inline`) when the trial id has no
  reviewed version (a reviewed one always wins, verdict.serve.trials.serving).

Every decision records its `TrialVersion` (artifacts `trial_version`), and the JSON response, the
decision record, the history and the clinician page show it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from .errors import ServiceError

PREVIEW_ROLE = "trial_owner"
InactiveUse = Literal["refuse", "preview", "pinned", "inline"]


class InactiveVersion(ServiceError):
    """A match pinned a version that is not the trial's active one, without the role to preview it."""

    status, code = 409, "inactive_version"


class TrialVersion(BaseModel):
    """The trial version a decision was made against, as it stood at decision time."""

    program_hash: str = Field(description="the version decided against")
    origin: str = Field(description="parser, upload or revision")
    reviewed: bool = Field(description="whether a person uploaded or revised it (origin upload or revision)")
    active: bool = Field(description="whether it was the trial's active version when decided")
    active_program_hash: str | None = Field(description="the trial's active version when decided")
    use: Literal["active", "preview", "pinned", "inline"] = Field(
        description="active: the trial's decision; preview: a trial_owner's match against an inactive "
        "version (not the trial's decision); pinned: a batch's or a lineage's version that became "
        "inactive meanwhile; inline: the parse of criteria text given with the request"
    )

    @classmethod
    def of(cls, row: Any, active_row: Any, inactive_use: InactiveUse) -> TrialVersion:
        """The version `row` (a TrialRow), given the trial's active row; InactiveVersion when `row`
        is not active and `inactive_use` is refuse."""
        active_hash = active_row.program_hash if active_row is not None else None
        active = active_hash == row.program_hash
        if not active and inactive_use == "refuse":
            raise InactiveVersion(
                f"version {row.program_hash} of trial '{row.trial_id}' is not its active version "
                f"({active_hash}): omit program_hash to match against the active version; only a key "
                f"with the {PREVIEW_ROLE} role may match against another version, as a preview",
                [("program_hash", f"the active version is {active_hash}")],
            )
        return cls(
            program_hash=row.program_hash,
            origin=row.origin,
            reviewed=bool(row.reviewed),
            active=active,
            active_program_hash=active_hash,
            use="active" if active else inactive_use,
        )

    @classmethod
    def recorded(cls, artifacts: dict | None) -> TrialVersion | None:
        """The version a stored decision records; None for a decision stored before it was recorded."""
        raw = (artifacts or {}).get("trial_version")
        try:
            return cls.model_validate(raw) if raw is not None else None
        except ValidationError:
            return None

    def banner(self, trial_id: str) -> str | None:
        """What a reader must be told (plain text), or None when the version was the active one."""
        if self.active:
            return None
        what = {
            "preview": "a preview by the trial's owner",
            "pinned": "pinned by a batch or by the decision it re-derives",
            "inline": "parsed from the criteria text given with the request",
        }.get(self.use, self.use)
        reviewed = "reviewed" if self.reviewed else "not reviewed"
        return (
            f"Not the trial's decision: made against version {self.program_hash} of trial {trial_id} "
            f"({self.origin}, {reviewed}), which is not its active version ({self.active_program_hash}); "
            f"{what}. The active version decides for the trial."
        )


def inactive_use_for(key: Any) -> InactiveUse:
    """How a key may use an inactive version: trial_owner (or admin) previews, others are refused."""
    return "preview" if key.allows(PREVIEW_ROLE) else "refuse"
