"""The clinician page's view model: plain data restated from the decision record (decision, resolved
patient, program, history), in the order and words the page shows them. Nothing is decided and
nothing is marked up here: the templates (serve/templates/, autoescaped) turn it into HTML.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property

from verdict.core.decision import Decision
from verdict.core.formula import render
from verdict.core.patient import ResolvedPatient
from verdict.core.program import TrialProgram
from verdict.core.ranking import rests_on_unasked
from verdict.core.rationale import rationale_json
from verdict.data_gen.formalizer import ChartRead, PassageConflict

from .audit import DecisionRow
from .audit.artifacts import DecisionArtifacts
from .quote_hash import quote_hashing
from .stored_record import stored_documents
from .trial_versions import TrialVersion

# Worded per side: an exclusion criterion "met" would read as "the patient has the excluding condition".
LABEL_TEXT = {
    "inclusion": {"satisfied": "met", "violated": "not met", "deferred": "open"},
    "exclusion": {"satisfied": "does not apply", "violated": "applies: excludes", "deferred": "open"},
}
ESTABLISHED_TEXT = {"screening_visit": "at the screening visit", "chart": "in the chart"}
# A reviewed value's evidence_source (serve/reviews): where it was established.
REVIEWED_TEXT = {
    "screening_visit": "confirmed at the screening visit",
    "chart": "confirmed in the chart",
    "reviewer": "corrected by a reviewer",
}
REVIEW_ACTION = "/v1/decisions/{decision_id}/page/review"  # the page router's form target
# The rest of the criteria start collapsed when there are more than this many: folding two or three
# rows away would hide more than it saves.
COLLAPSE_OVER = 4
_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)\s*")
TIME_FORMAT = "%Y-%m-%d %H:%M UTC"


@dataclass(frozen=True)
class PageViewer:
    """Who looks at the page: a logged-in reviewer gets the review forms (with the session's CSRF
    token); anyone else a line saying why not."""

    csrf: str | None = None  # the session's CSRF token; None: no login session (API key header)
    can_review: bool = False
    who: str | None = None  # the key's name, shown in the header bar
    logout: bool = False  # a session: show the logout button
    note: str | None = None  # why there are no forms, when it is not the role or the session

    @property
    def forms(self) -> bool:
        return self.can_review and self.csrf is not None

    def why_no_forms(self) -> str:
        if self.note:
            return self.note
        if self.csrf is None:
            return "Log in at /login with a key that has the review role to confirm, correct or flag."
        return "Your key lacks the review role: you can read this page but not review it."


def evidence_spans(note: str, quotes: dict[str, str]) -> list[tuple[int, int, list[str]]]:
    """Where each atom's evidence quote occurs in the note: (start, end, atoms), merged, in order.
    Quotes match after whitespace normalization, as the formalizer checks them; pieces joined by
    '...' are found one after the other."""
    raw: list[tuple[int, int, str]] = []
    for atom, quote in quotes.items():
        pos = 0
        for piece in (p for p in _ELLIPSIS.split(quote) if p.strip()):
            pattern = r"\s+".join(re.escape(w) for w in piece.split())
            m = re.compile(pattern).search(note, pos)
            if m is None:
                break
            raw.append((m.start(), m.end(), atom))
            pos = m.end()
    raw.sort()
    merged: list[tuple[int, int, list[str]]] = []
    for start, end, atom in raw:
        if merged and start < merged[-1][1]:
            s, e, atoms = merged[-1]
            merged[-1] = (s, max(e, end), atoms + [atom] if atom not in atoms else atoms)
        else:
            merged.append((start, end, [atom]))
    return merged


@dataclass(frozen=True)
class Segment:
    """A piece of a note: plain text, or a highlighted quote (`mark`: its anchor id)."""

    text: str
    mark: str | None = None
    atoms: str = ""  # the atoms the quote is evidence for, space-separated


def note_segments(note: str, spans: list[tuple[int, int, list[str]]], prefix: str = "ev-") -> list[Segment]:
    out, pos = [], 0
    for i, (start, end, atoms) in enumerate(spans):
        out.append(Segment(note[pos:start]))
        out.append(Segment(note[start:end], f"{prefix}{i}", " ".join(atoms)))
        pos = end
    out.append(Segment(note[pos:]))
    return out


def decisive_criteria(decision: Decision, patient: ResolvedPatient) -> set[tuple[str, str]]:
    """(cohort, criterion) of the criteria that decide the pair: for an ineligible decision the
    violated ones; otherwise those resting on assumptions (open, or met through an imputed value)."""
    if decision.decision == "ineligible":
        return {(lb.cohort, lb.criterion) for lb in decision.labels if lb.label == "violated"}
    res = patient.by_atom()
    out = {(s.cohort, s.criterion) for s in decision.trace.steps if s.status == "assumed"}
    for lb in decision.labels:
        imputed = any(a in res and res[a].status == "imputed" for a in lb.facts)
        if lb.label == "deferred" or imputed:
            out.add((lb.cohort, lb.criterion))
    return out


@dataclass(frozen=True)
class ValueInput:
    """A review form's value field: a yes/no select for a boolean atom, else a text box."""

    boolean: bool
    unknown: bool  # "unknown" is offered (a correction may leave the value to the policy)
    no_selected: bool = False  # a correction of a true value starts from "no"
    unit: str = ""


@dataclass(frozen=True)
class ReviewForm:
    """One review form (kind confirm / correct / flag); `ids`: its atom or criterion."""

    kind: str
    ids: dict[str, str]
    value: ValueInput | None = None


@dataclass(frozen=True)
class Fact:
    atom: str
    name: str  # the atom's readable name (its definition); the identifier is a detail
    known: bool = True  # False: the patient has no resolution for the atom
    shown: str = ""
    evidence: str | None = None
    ref: str | None = None  # the highlighted quote's anchor
    where: str = ""
    reviewed: str | None = None
    imputed: tuple[str, str] | None = None  # (policy rule, reason)
    correct: ReviewForm | None = None


@dataclass(frozen=True)
class Formal:
    readable: str
    criterion: str
    formula: str


@dataclass(frozen=True)
class CriterionRow:
    criterion: str
    side: str
    text: str
    label: str
    label_text: str
    decisive: bool
    facts: list[Fact]
    open: list[tuple[str, str]]  # (readable name, atom)
    formal: Formal | None
    flag: ReviewForm | None


@dataclass(frozen=True)
class ToConfirm:
    atom: str
    name: str
    detail: str  # the requirement (to_confirm) or "" (an open condition)
    meta: str
    form: ReviewForm | None


@dataclass(frozen=True)
class Document:
    id: str
    index: int
    info: str
    segments: list[Segment]

    @property
    def has_evidence(self) -> bool:
        """Whether a quote of this decision is in this document (the page folds the others)."""
        return any(s.mark for s in self.segments)


@dataclass(frozen=True)
class ConflictView:
    atom: str
    findings: list[tuple[str, str, str]]  # (document, value shown, quote)


@dataclass(frozen=True)
class ChangeView:
    """One recorded change (verdict.serve.reviews RecordedChange), in words."""

    type: str
    head: str  # "confirmed" / "corrected" / "flagged criterion" / "re-screened"
    name: str | None  # the atom's readable name
    ident: str
    tail: str  # after the identifier: "= yes at the screening visit", "to 3", ": note"
    reason: str
    reviewer: str


@dataclass(frozen=True)
class EntryView:
    decision_id: str
    this: bool
    decision: str
    kind: str
    when: str
    created_by: str
    changes: list[ChangeView]


@dataclass(frozen=True)
class HistoryView:
    offset: int
    link: str
    entries: list[EntryView]
    superseded_by: str | None


@dataclass(frozen=True)
class ChangeLine:
    """A line of "What would change the decision"; `meta`: a remark, not a change."""

    text: str
    meta: bool = False
    id: str = ""


@dataclass
class DecisionPage:
    """Everything the decision page shows, in plain data."""

    title: str
    heading: str
    viewer: PageViewer
    decision_id: str
    patient_id: str
    trial_id: str
    decision: str
    summary: str
    reason: str
    notices: list[tuple[str, str]]  # (element id, text)
    history: HistoryView | None
    forms_note: str | None
    decisive: list[CriterionRow]
    other: list[CriterionRow]
    lead: str
    other_open: bool
    chart_read: str | None
    documents: list[Document]
    several: bool
    conflicts: list[ConflictView]
    to_confirm: list[ToConfirm]
    waiting: list[ToConfirm]
    waiting_folded: bool
    change_title: str
    change: list[ChangeLine]
    unkeyed: bool  # the quote hashes were recorded before keyed hashing
    record: dict[str, str] = field(default_factory=dict)
    action: str = ""


def _val(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime(TIME_FORMAT)


def change_view(c, name) -> ChangeView:
    """A recorded change in words; `name(atom)` gives an atom's readable name."""
    value = "unknown" if c.value is None else _val(c.value)
    if c.type == "confirm":
        where = ESTABLISHED_TEXT.get(c.established or "", c.established or "")
        head, tail = "confirmed", f" = {value} {where}"
    elif c.type == "correct":
        head, tail = "corrected", f" to {value}"
    elif c.type == "flag":
        head = "flagged criterion" if c.criterion else "flagged the decision"
        tail = f": {c.note or ''}"
    elif c.type == "feedback":
        head, tail = "EHR card", f" {(c.details or {}).get('outcome', '')}"
    elif c.type == "reread":
        details = c.details or {}
        found = details.get("status") == "observed"
        where = f" (document {details['document']})" if found and details.get("document") else ""
        head, tail = (
            "re-read in the whole chart",
            f" = {value}{where}" if found else ": not found in the chart",
        )
    elif c.type == "complete":
        details = c.details or {}
        asked, found = len(details.get("atoms") or []), len(details.get("found") or [])
        head, tail = (
            "completed the mining",
            f": {asked} atom(s) not asked were read, {found} found in the chart",
        )
    else:
        head, tail = "re-screened", json.dumps(c.details or {}, sort_keys=True)
    return ChangeView(
        type=c.type,
        head=head,
        name=name(c.atom) if c.atom else None,
        ident=c.atom or c.criterion or "",
        tail=tail,
        reason=c.reason,
        reviewer=c.reviewer,
    )


def history_view(decision_id: str, history, name) -> HistoryView | None:
    """The decision's lineage, oldest first, each with the changes that led to it; None for a
    decision that nothing supersedes and that supersedes nothing."""
    if history is None or (history.total <= 1 and not history.superseded):
        return None
    entries = [
        EntryView(
            decision_id=e.decision_id,
            this=e.decision_id == decision_id,
            decision=e.decision,
            kind=e.kind,
            when=_when(e.created_at),
            created_by=e.created_by,
            changes=[change_view(c, name) for c in e.changes],
        )
        for e in history.entries
    ]
    return HistoryView(
        offset=history.offset,  # the page shows the newest entries; the rest is a page of the history API
        link=f"/v1/decisions/{decision_id}/history",
        entries=entries,
        superseded_by=history.current_id if history.superseded else None,
    )


@dataclass(frozen=True)
class _Record:
    """One decision's record, read once, with the lookups every part of the page shares."""

    program: TrialProgram
    decision: Decision
    patient: ResolvedPatient
    viewer: PageViewer
    several: bool  # the patient text is several documents (each shown under its own heading)
    span_of: dict[str, str]  # atom -> the anchor of its highlighted quote

    @cached_property
    def atoms(self):
        return self.program.atom_table()

    @cached_property
    def resolved(self):
        return self.patient.by_atom()

    def name(self, a: str) -> str:
        atoms = self.atoms
        return atoms[a].definition.rstrip(". ") if a in atoms else a

    def bracketed(self, a: str) -> str:  # an atom inside a rendered formula
        return f"[{self.name(a)}]" if a in self.atoms else a

    def form(self, kind: str, a: str) -> ReviewForm | None:
        """A confirm or correct form for atom `a`, for a viewer who may review."""
        if not self.viewer.forms:
            return None
        atom, unknown = self.atoms.get(a), kind == "correct"
        if atom is not None and atom.domain == "bool":
            r = self.resolved.get(a)  # a correction starts from the other value
            value = ValueInput(boolean=True, unknown=unknown, no_selected=r is not None and r.value is True)
        else:
            unit = atom.unit if atom is not None and atom.unit else ""
            value = ValueInput(boolean=False, unknown=unknown, unit=unit)
        return ReviewForm(kind, {"atom": a}, value)

    def fact(self, a: str) -> Fact:
        r = self.resolved.get(a)
        if r is None:
            return Fact(atom=a, name=self.name(a), known=False)
        observed = r.status == "observed" and bool(r.evidence)
        source = r.evidence_source
        return Fact(
            atom=a,
            name=self.name(a),
            shown=r.bounds.text("value") if r.bounds else _val(r.value),
            evidence=r.evidence if observed else None,
            ref=self.span_of.get(a) if observed else None,
            where=f"in {source}" if self.several and source else "in the note",
            reviewed=REVIEWED_TEXT.get(source or ""),
            imputed=(r.imputation.rule, r.imputation.reason)
            if r.status == "imputed" and r.imputation
            else None,
            correct=self.form("correct", a) if r.status == "observed" else None,
        )


def _documents(
    row: DecisionRow, art: DecisionArtifacts, patient: ResolvedPatient
) -> tuple[list[Document], bool]:
    """The patient text as documents with each quote highlighted in the document it came from (a
    record without sources: the one note); and whether it is several documents."""
    docs = stored_documents(row)
    first = docs[0]["id"] if docs else None
    quotes: dict[str, dict[str, str]] = {doc["id"]: {} for doc in docs}
    for r in patient.resolutions:
        if r.status == "observed" and r.evidence and (r.evidence_source or first) in quotes:
            quotes[r.evidence_source or first][r.atom] = r.evidence
    several = len(docs) > 1 or art.documents is not None
    meta = {m["id"]: m for m in art.documents or []}
    out = []
    for k, doc in enumerate(docs):
        m = meta.get(doc["id"], {})
        spans = evidence_spans(doc["text"], quotes[doc["id"]])
        segments = note_segments(doc["text"], spans, f"ev-{k}-" if several else "ev-")
        info = ", ".join(str(m[x]) for x in ("kind", "date") if m.get(x))
        out.append(Document(id=doc["id"], index=k, info=info, segments=segments))
    return out, several


def _criteria(rec: _Record, rj: dict) -> dict[bool, list[CriterionRow]]:
    """The criteria rows: those that decide the pair (True) and the rest (False), each in order."""
    formulas = {(co.id, c.id): c.formula for co, _, c in rec.program.criteria()}
    decisive = decisive_criteria(rec.decision, rec.patient)
    rows: dict[bool, list[CriterionRow]] = {True: [], False: []}
    for c in rj["criteria"]:
        key = (c["cohort"], c["criterion"])
        formula = formulas.get(key)
        formal = Formal(render(formula, rec.bracketed), c["criterion"], render(formula)) if formula else None
        rows[key in decisive].append(
            CriterionRow(
                criterion=c["criterion"],
                side=c["side"],
                text=c["text"],
                label=c["label"],
                label_text=LABEL_TEXT[c["side"]].get(c["label"], c["label"]),
                decisive=key in decisive,
                facts=[rec.fact(e["atom"]) for e in c["evidence"]],
                open=[(rec.name(a), a) for a in c["open"]],
                formal=formal,
                flag=ReviewForm("flag", {"criterion": c["criterion"]}) if rec.viewer.forms else None,
            )
        )
    return rows


def _to_confirm(rec: _Record, rj: dict) -> tuple[list[ToConfirm], list[ToConfirm]]:
    """What to confirm at the visit, and the atoms the chart leaves open that a criterion waits on."""
    items = [
        ToConfirm(
            x["atom"], rec.name(x["atom"]), x["requirement"] or "", x["class"], rec.form("confirm", x["atom"])
        )
        for x in rj["to_confirm"]
    ]
    seen = {x["atom"] for x in rj["to_confirm"]}
    waiting: list[ToConfirm] = []
    for lb in rec.decision.labels:
        for a in lb.open_atoms:
            if a not in seen and a in rec.atoms:
                seen.add(a)
                meta = f"not in the chart; criterion {lb.criterion} waits on it"
                waiting.append(ToConfirm(a, rec.name(a), "", meta, rec.form("confirm", a)))
    return items, waiting


def _what_would_change(decision: Decision, rj: dict) -> tuple[str, list[ChangeLine]]:
    change = [ChangeLine(x["text"]) for x in rj["would_change"]]
    if decision.pivotal is None:
        return "What would change the decision", [ChangeLine("Not computed for this decision.")]
    target = "eligible" if decision.pivotal.direction == "to_eligible" else "ineligible"
    noted = not change  # the note stands in for an empty δ
    if noted:
        change = [ChangeLine(decision.pivotal.note or "No change of the modelled conditions.")]
    if decision.pivotal.alternatives:
        change.append(ChangeLine(f"{len(decision.pivotal.alternatives)} other minimal way(s) exist.", True))
    if not noted and rests_on_unasked(decision):  # staged mining: some atoms were never asked
        change.append(ChangeLine(decision.pivotal.note or "", True, "not-asked"))
    return f"What would make the patient {target}", change


def decision_page(
    row: DecisionRow, program: TrialProgram, viewer: PageViewer | None = None, history=None, notice: str = ""
) -> DecisionPage:
    """The view of one decision. `history` is the decision's `DecisionHistory` (verdict.serve.reviews),
    if any; `notice` a line shown on top (e.g. the review just recorded)."""
    viewer = viewer or PageViewer()
    if history is not None and history.superseded and viewer.forms:  # reviews go to the newest decision
        viewer = replace(viewer, can_review=False, note="A newer decision supersedes this one: review that.")
    # Not validated again: the record was checked when written, and a page of an older row must not
    # fail on a field it does not show.
    art = DecisionArtifacts.model_construct(**row.artifacts)
    decision = Decision.model_validate(art.decision)
    patient = ResolvedPatient.model_validate(art.patient)
    documents, several = _documents(row, art, patient)
    span_of = {a: s.mark for doc in documents for s in doc.segments if s.mark for a in s.atoms.split()}
    rec = _Record(program, decision, patient, viewer, several, span_of)
    rj = rationale_json(program, patient, decision)
    rows = _criteria(rec, rj)
    lead = (
        {
            "ineligible": "The criteria the patient fails:",
            "eligible": "The criteria that rest on assumptions (to confirm at the visit):",
        }.get(decision.decision, "The criteria still open:")
        if rows[True]
        else "Every criterion is settled by the chart:"
    )
    to_confirm, waiting = _to_confirm(rec, rj)
    change_title, change = _what_would_change(decision, rj)
    conflicts = [
        ConflictView(c.atom, [(f.document, f.shown(c.atom), f.evidence) for f in c.findings])
        for c in (PassageConflict.model_validate(x) for x in art.extraction_conflicts or [])
    ]
    notices = [("notice", notice)] if notice else []
    version = TrialVersion.recorded(row.artifacts)
    inactive = version.banner(row.trial_id) if version is not None else None
    if inactive:
        notices.append(("inactive-version", inactive))
    read = art.chart_read  # raw (the record is read with model_construct: old rows are never refused)
    models = row.models
    return DecisionPage(
        title=f"{row.trial_id} / {row.patient_id}: {decision.decision}",
        heading=program.title or row.trial_id,
        viewer=viewer,
        decision_id=row.decision_id,
        patient_id=row.patient_id,
        trial_id=row.trial_id,
        decision=decision.decision,
        summary=decision.trace.summary,
        reason=decision.reason or "",
        notices=notices,
        history=history_view(row.decision_id, history, rec.name),
        forms_note=None if viewer.forms else viewer.why_no_forms(),
        decisive=rows[True],
        other=rows[False],
        lead=lead,
        other_open=len(rows[False]) <= COLLAPSE_OVER,
        chart_read=ChartRead.model_validate(read).summary() if read else None,
        documents=documents,
        several=several,
        conflicts=conflicts,
        to_confirm=to_confirm,
        waiting=waiting,
        waiting_folded=len(waiting) > COLLAPSE_OVER,  # a long tail of open conditions: folded
        change_title=change_title,
        change=change,
        unkeyed=quote_hashing(row.artifacts) == "unkeyed",
        record={
            "when": _when(row.created_at),
            "policy": f"{row.policy_name} v{row.policy_version}",
            "program": row.program_hash,
            "value_miner": str(models.get("value_miner")),
            "parser": str(models.get("parser") or "none (an uploaded or revised program)"),
            "base_model": str(models.get("base_model")),
            "engine": row.engine_version,
        },
        action=REVIEW_ACTION.format(decision_id=row.decision_id),
    )
