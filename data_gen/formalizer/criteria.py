"""Split a trial's eligibility text into criteria, deterministically: the parser's unit of work.

Rules (docs/data_gen.md, "Trial parser"):
- Sections: `inclusion` / `exclusion` where the trial has them split, else the raw `criteria` text
  split at its "Inclusion Criteria" / "Exclusion Criteria" headings (text before any heading counts
  as inclusion).
- Items: blocks separated by blank lines; inside a block a new item starts at a line that begins
  with a bullet or number marker (`-`, `*`, `•`, `1.`, `a)`, `(ii)`), after a line shorter than
  60 characters (registry text is hard-wrapped near 80 columns, so a short line ended on purpose),
  or after a line that ends a sentence (`.`, `;`) when the next line starts with a capital. Any
  other line is a wrapped continuation of the line before it.
- Headings are dropped and counted: the section's own heading ("Inclusion Criteria:"), a bare
  marker with no text, and a "... characteristics:" / "... criteria:" heading ("DISEASE
  CHARACTERISTICS:", "Disease Characteristics--"). A short label ("Age:", "Performance status:",
  "PRIOR CONCURRENT THERAPY:") prefixes the items under it ("Age: 18 and over") until the next
  label, lead-in or heading, so no text is lost. A lead-in ("... one of the following:", any
  line ending in ':' that is not a label) starts a group: it and the items after it, up to the next
  lead-in, label or the section's end, are one criterion (one line per item), since splitting an
  "any of" list into separate requirements would change its meaning - except where the items are
  independent requirements (`distributes`: any item of an exclusion list excludes; an inclusion
  list that says "all of"): then each item is a criterion of its own, its lead-in repeated as
  context, so one call never has to formalize a whole section. The flattened ctgov text
  does not say where a nested list ends, so a group may take in items after it: larger, but sound.
- Ids: `inc-1`, `inc-2`, ... and `exc-1`, ... in order of appearance; a criterion split to fit the
  prompt budget keeps its id with a part suffix (`inc-3.1`, `inc-3.2`).
- Too long for the prompt budget: split at sentence boundaries into parts that fit (a group at
  its items, each part repeating the lead-in, reported in `Split.split_groups` for review); a
  single piece that still does not fit is kept whole and reported (`Split.oversize`), never cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .protocol import TrialDoc

Side = Literal["inclusion", "exclusion"]
SIDE_PREFIX = {"inclusion": "inc", "exclusion": "exc"}

_SECTION = re.compile(r"^\s*[-*•]?\s*(inclusion|exclusion)\s+criteria\b\s*[:.\-]?\s*", re.IGNORECASE)
_INLINE_SECTION = re.compile(
    r"^\s*[-*•]?\s*(inclusion|exclusion)\s+criteria\b\s*[:.\-]?\s*$", re.IGNORECASE | re.MULTILINE
)
_MARKER = re.compile(  # a bullet, "1." / "2)", "a)" / "b.", "(3)" / "(iv)"
    r"^\s*(?:[-*•·‣▪◦:]+|\d{1,3}[.)](?!\d)|[a-zA-Z][.)](?=\s)"
    r"|\((?:\d{1,3}|[a-zA-Z]|[ivxIVX]{1,5})\))\s*"
)
_SENTENCE_END = re.compile(r"[.;]\s*$")
_SENTENCE = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(\[])")
_LABEL_WORDS = 4
_SECTION_LABEL = re.compile(
    r"\b(?:characteristics|criteria)\s*:$", re.IGNORECASE
)  # "PATIENT CHARACTERISTICS:"
_WRAP_WIDTH = 60  # registry text is hard-wrapped near 80 columns: a shorter line ended on purpose
_LEAD_IN_WORDS = {
    "following",
    "defined",
    "as",
    "below",
    "either",
    "include",
    "including",
    "includes",
    "any",
    "one",
    "all",
    "must",
    "have",
    "has",
    "are",
    "is",
    "be",
    "meet",
    "these",
    "criteria",
}


@dataclass(frozen=True)
class CriterionText:
    """One criterion as the parser sees it."""

    id: str
    side: Side
    text: str


@dataclass
class Split:
    criteria: list[CriterionText] = field(default_factory=list)
    headings: list[str] = field(
        default_factory=list
    )  # dropped lines (section headings, labels, bare markers)
    oversize: list[str] = field(default_factory=list)  # ids of criteria that still exceed the budget
    split_groups: list[str] = field(default_factory=list)  # lead-in groups split into parts to fit
    distributed_groups: int = 0  # lead-in groups of independent requirements, one criterion per item

    def by_id(self) -> dict[str, CriterionText]:
        return {c.id: c for c in self.criteria}


def sections(trial: TrialDoc) -> list[tuple[Side, str]]:
    """(side, text) of the trial's inclusion and exclusion sections."""
    if trial.inclusion or trial.exclusion:
        return [("inclusion", trial.inclusion or ""), ("exclusion", trial.exclusion or "")]
    out: list[tuple[Side, str]] = []
    side: Side = "inclusion"
    start = 0
    for m in _INLINE_SECTION.finditer(trial.criteria or ""):
        out.append((side, trial.criteria[start : m.start()]))
        side = m.group(1).lower()  # type: ignore[assignment]
        start = m.start()  # keep the heading: split_section drops and counts it
    out.append((side, (trial.criteria or "")[start:]))
    return [(s, t) for s, t in out if t.strip()]


def _lines_to_items(text: str) -> list[str]:
    """Logical lines: wrapped continuations joined, one per bullet / paragraph / sentence line."""
    items: list[str] = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        cur: str | None = None
        prev = ""
        for raw in block.split("\n"):
            line = raw.strip()
            if not line:
                continue
            new = (
                cur is None
                or bool(_MARKER.match(line))
                or len(prev) < _WRAP_WIDTH
                or (bool(_SENTENCE_END.search(cur)) and line[:1].isupper())
                or cur.endswith(":")
            )
            prev = line
            if new:
                if cur is not None:
                    items.append(cur)
                cur = line
            else:
                cur = f"{cur} {line}"
        if cur is not None:
            items.append(cur)
    return items


def _is_label(text: str) -> bool:
    """A short topic label ("Age:", "Severity of Disease:"), not a lead-in ("defined as:")."""
    words = text[:-1].lower().split()
    return text.endswith(":") and len(words) <= _LABEL_WORDS and not _LEAD_IN_WORDS & set(words)


# Lead-in words that make a list's items depend on each other ("all of", "two or more of") on the
# exclusion side, or make it a disjunction ("one of", "either") on the inclusion side.
_JOINT = {
    "all",
    "both",
    "each",
    "every",
    "combination",
    "together",
    "two",
    "three",
    "more",
    "least",
    "none",
    "neither",
    "nor",
}
_ALTERNATIVE = {"one", "any", "either", "or", "least", "none", "neither", "nor"}


def distributes(side: Side, lead_in: str) -> bool:
    """Whether a lead-in group is a list of independent requirements, so splitting it into one
    criterion per item keeps its meaning: on the exclusion side any item excludes ("any of the
    following", or no quantifier), unless the lead-in joins the items ("all of", "two or more of");
    on the inclusion side only an explicit "all of" list without alternatives ("must have all of:").
    """
    words = set(re.findall(r"[a-z]+", lead_in.lower()))
    if side == "exclusion":
        return not words & _JOINT
    return "all" in words and not words & _ALTERNATIVE


def split_section(side: Side, text: str, out: Split) -> list[str]:
    """The criterion texts of one section (headings go to `out.headings`)."""
    texts: list[str] = []
    label = ""
    group: list[str] | None = None

    def close_group() -> None:
        nonlocal group
        if group and len(group) > 2 and distributes(side, group[0]):
            # each item is a requirement of its own: one criterion per item, the lead-in kept as
            # its context (it may carry a condition: "history of:"), so no meaning is lost
            texts.extend(f"{group[0]}\n- {x}" for x in group[1:])
            out.distributed_groups += 1
        elif group:
            texts.append("\n".join([group[0]] + [f"- {x}" for x in group[1:]]))
        group = None

    for item in _lines_to_items(text):
        m = _SECTION.match(item)
        if m and m.group(1).lower() == side and not item[m.end() :].strip():
            out.headings.append(item)
            continue
        if m and m.group(1).lower() == side:  # "Inclusion Criteria: adults ..." on one line
            out.headings.append(item[: m.end()].strip())
            item = item[m.end() :]
        body = _MARKER.sub("", item, count=1).strip()
        if not body:
            if item.strip():
                out.headings.append(item.strip())
            continue
        if body.endswith("--"):  # "Disease Characteristics--": a PDQ-style heading
            body = body.rstrip("-").rstrip() + ":"
        if body.endswith(":") and _SECTION_LABEL.search(body) and len(body.split()) <= _LABEL_WORDS:
            close_group()
            label = ""
            out.headings.append(body)
            continue
        if _is_label(body):
            close_group()
            label = body
            continue
        if body.endswith(":"):
            close_group()
            label = ""  # a label covers the items up to the next lead-in, label or heading
            group = [body]
            continue
        if group is not None:
            group.append(body)
        else:
            texts.append(f"{label} {body}".strip())
    close_group()
    if label and not texts:  # a label with nothing under it is still text of the trial
        texts.append(label)
    return texts


def split_trial(trial: TrialDoc, fits: Callable[[CriterionText], bool] | None = None) -> Split:
    """The trial's criteria in order. `fits` says whether a criterion's prompt is within budget;
    those that do not are split at sentence boundaries (or reported in `oversize`)."""
    out = Split()
    n = {"inclusion": 0, "exclusion": 0}  # numbered per side across sections (a text may repeat a heading)
    for side, text in sections(trial):
        for t in split_section(side, text, out):
            n[side] += 1
            c = CriterionText(id=f"{SIDE_PREFIX[side]}-{n[side]}", side=side, text=normalize_criterion(t))
            if fits is None or fits(c):
                out.criteria.append(c)
                continue
            parts = _fit_parts(c, fits)
            out.criteria += parts
            if len(parts) > 1 and "\n" in c.text:
                out.split_groups.append(c.id)
            out.oversize += [p.id for p in parts if not fits(p)]
    return out


def _fit_parts(c: CriterionText, fits: Callable[[CriterionText], bool]) -> list[CriterionText]:
    """Greedy: consecutive pieces joined while the part fits. A group's pieces are its items, each
    part repeating the lead-in; a plain criterion's pieces are its sentences."""
    if "\n" in c.text:
        lead, *pieces = c.text.split("\n")
        head, sep = f"{lead}\n", "\n"
    else:
        head, sep, pieces = "", " ", [s for s in _SENTENCE.split(c.text) if s.strip()]
    parts: list[str] = []
    for s in pieces:
        if parts and fits(CriterionText(c.id, c.side, f"{head}{parts[-1]}{sep}{s}")):
            parts[-1] = f"{parts[-1]}{sep}{s}"
        else:
            parts.append(s)
    if len(parts) == 1:
        return [c]
    return [CriterionText(f"{c.id}.{i}", c.side, f"{head}{p}") for i, p in enumerate(parts, 1)]


def normalize_criterion(text: str, case: bool = False) -> str:
    """The criterion as the request carries it (whitespace collapsed; a group keeps one line per
    item); `case=True` also folds case
    (a figure only: the request keeps the trial's capitals, "ALT" is not "alt")."""
    t = "\n".join(" ".join(line.split()) for line in text.split("\n") if line.strip())
    return t.lower() if case else t
