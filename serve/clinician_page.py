"""The clinician's view of one decision, as a self-contained HTML page (no scripts, no external
resources): the decision, the criteria that decide it first (the rest collapsed), each with its
evidence highlighted in the note, what to confirm at the screening visit, what would change the
decision, the decision's history, and - for a reviewer logged in - plain HTML review forms.

Everything shown is restated from the audit record (decision, resolved patient, program); nothing
is decided here. Every piece of text is HTML-escaped: notes and criteria are data, never markup.
Readable at 1,280 px on the largest reference programs: fixed-layout tables, and identifiers (long
atom names) wrap anywhere and are shown as a detail, never as the headline.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from html import escape

from verdict.core.decision import Decision
from verdict.core.formula import render
from verdict.core.patient import ResolvedPatient
from verdict.core.program import TrialProgram
from verdict.core.ranking import rests_on_unasked
from verdict.core.rationale import rationale_json
from verdict.data_gen.formalizer.miner import PassageConflict
from verdict.data_gen.protocol import ChartRead

from .audit import DecisionRow
from .quote_hash import quote_hashing
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

_CSS = """
*,*::before,*::after{box-sizing:border-box}
body{font-family:system-ui,sans-serif;max-width:72rem;margin:1.5rem auto;padding:0 1rem;color:#1b1b1b;
line-height:1.45;overflow-wrap:anywhere}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.8rem;border-bottom:1px solid #ddd}h3{font-size:1rem}
.decision{display:inline-block;padding:.2rem .7rem;border-radius:.3rem;font-weight:700;
text-transform:uppercase}
.eligible{background:#d8f3dc;color:#1b4332}.ineligible{background:#ffd6d6;color:#7a0000}
.undetermined{background:#fff3bf;color:#5c4400}
table{border-collapse:collapse;width:100%;table-layout:fixed}
td,th{border:1px solid #ddd;padding:.35rem .5rem;vertical-align:top;text-align:left}
col.side{width:6.5rem}col.status{width:8.5rem}col.text{width:42%}
tr.decisive td{background:#fffaf0}
.label-satisfied{color:#1b4332;font-weight:600}.label-violated{color:#7a0000;font-weight:600}
.label-deferred{color:#5c4400;font-weight:600}
.note{white-space:pre-wrap;background:#fafafa;border:1px solid #ddd;padding:.8rem;
font-family:ui-monospace,monospace}
mark{background:#ffe066;padding:0 .1rem}.meta{color:#555;font-size:.9rem}
code{font-size:.85em;white-space:pre-wrap}.ident{color:#666;font-size:.8rem}
.fact{display:block;margin-bottom:.4rem}
details{margin:.3rem 0}summary{cursor:pointer;color:#1d4e89}
details.other>summary{font-weight:600;padding:.3rem 0}
form.review{border:1px solid #c9d6e8;background:#f5f8fc;padding:.5rem;margin:.3rem 0;max-width:40rem}
form.review label{display:block;margin:.2rem 0}
input,select,textarea,button{font:inherit;max-width:100%}textarea{width:100%;min-height:2.6rem}
input[type=text],input[type=password]{width:100%}
.banner{border:1px solid #c9d6e8;background:#eef4fb;padding:.5rem .8rem}
.error{border:1px solid #e0a0a0;background:#fff0f0;padding:.5rem .8rem}
header.bar{display:flex;flex-wrap:wrap;gap:.5rem 1rem;justify-content:space-between;align-items:center;
font-size:.9rem;color:#555;border-bottom:1px solid #eee;padding-bottom:.4rem}
header.bar form{display:inline}
"""
# Every page (the clinician page, login, errors) uses this one stylesheet, allowed by its hash; no
# script at all; forms only to this service.
PAGE_CSP = (
    "default-src 'none'; style-src 'sha256-"
    + base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
    + "'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_META_CSP = PAGE_CSP.replace(" frame-ancestors 'none';", "")  # a <meta> CSP cannot carry frame-ancestors


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


def shell(title: str, body: str, viewer: PageViewer | None = None) -> str:
    """A complete page: the one stylesheet, the CSP meta, the header bar (who, logout)."""
    bar = ""
    if viewer is not None and viewer.who:
        logout = ""
        if viewer.logout and viewer.csrf:
            logout = (
                f'<form method="post" action="/logout"><input type="hidden" name="csrf" '
                f'value="{escape(viewer.csrf)}"><button type="submit" id="logout">Log out</button></form>'
            )
        who = f"<span>Signed in as <strong>{escape(viewer.who)}</strong></span>"
        bar = f'<header class="bar">{who}{logout}</header>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{escape(_META_CSP)}">
<title>{escape(title)}</title><style>{_CSS}</style></head>
<body>{bar}
{body}
</body></html>
"""


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


def highlighted_note(note: str, spans: list[tuple[int, int, list[str]]], prefix: str = "ev-") -> str:
    out, pos = [], 0
    for i, (start, end, atoms) in enumerate(spans):
        out.append(escape(note[pos:start]))
        out.append(
            f'<mark id="{prefix}{i}" data-atoms="{escape(" ".join(atoms))}">{escape(note[start:end])}</mark>'
        )
        pos = end
    out.append(escape(note[pos:]))
    return "".join(out)


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


def render_page(
    row: DecisionRow, program: TrialProgram, viewer: PageViewer | None = None, history=None, notice: str = ""
) -> str:
    """The page of one decision. `history` is the decision's `DecisionHistory`
    (verdict.serve.reviews), if any; `notice` a line shown on top (e.g. the review just recorded)."""
    viewer = viewer or PageViewer()
    if history is not None and history.superseded and viewer.forms:  # reviews go to the newest decision
        viewer = replace(viewer, can_review=False, note="A newer decision supersedes this one: review that.")
    decision = Decision.model_validate(row.artifacts["decision"])
    patient = ResolvedPatient.model_validate(row.artifacts["patient"])
    rj = rationale_json(program, patient, decision)
    res = patient.by_atom()
    docs = stored_documents(row)
    first = docs[0]["id"] if docs else None
    # each quote is highlighted in the document it came from (a record without sources: the one note)
    quotes: dict[str, dict[str, str]] = {doc["id"]: {} for doc in docs}
    for r in patient.resolutions:
        if r.status == "observed" and r.evidence and (r.evidence_source or first) in quotes:
            quotes[r.evidence_source or first][r.atom] = r.evidence
    several = len(docs) > 1 or row.artifacts.get("documents") is not None
    anchors = {doc["id"]: f"ev-{k}-" if several else "ev-" for k, doc in enumerate(docs)}
    spans = {doc["id"]: evidence_spans(doc["text"], quotes[doc["id"]]) for doc in docs}
    span_of = {
        a: f"{anchors[doc]}{i}"
        for doc, sp in spans.items()
        for i, (_, _, atoms) in enumerate(sp)
        for a in atoms
    }
    source_of = {r.atom: r.evidence_source for r in patient.resolutions if r.evidence_source}
    atoms = program.atom_table()
    formulas = {(co.id, c.id): c.formula for co, _, c in program.criteria()}
    d = decision.decision
    when = datetime.fromtimestamp(row.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    action = REVIEW_ACTION.format(decision_id=row.decision_id)

    def what(a: str) -> str:  # an atom's readable name (its definition); the identifier is a detail
        return escape(atoms[a].definition.rstrip(". ")) if a in atoms else escape(a)

    def what_plain(a: str) -> str:  # for render(): escaped once, by the caller
        return f"[{atoms[a].definition.rstrip('. ')}]" if a in atoms else a

    def fact(a: str) -> str:
        r = res.get(a)
        if r is None:
            return f'<span class="fact">{what(a)} <code class="ident">{escape(a)}</code></span>'
        shown = r.bounds.text("value") if r.bounds else _val(r.value)
        out = f"{what(a)}: <strong>{escape(shown)}</strong>"
        if r.status == "observed" and r.evidence:
            where = f"in {source_of[a]}" if several and a in source_of else "in the note"
            ref = f' <a href="#{span_of[a]}">{escape(where)}</a>' if a in span_of else ""
            out += f' <q class="evidence">{escape(r.evidence)}</q>{ref}'
        if r.evidence_source in REVIEWED_TEXT:
            out += f' <span class="meta reviewed">({escape(REVIEWED_TEXT[r.evidence_source])})</span>'
        elif r.status == "imputed" and r.imputation:
            out += (
                f" (imputed by policy rule <code>{escape(r.imputation.rule)}</code>: "
                f"{escape(r.imputation.reason)})"
            )
        form = correct_form(a) if r.status == "observed" and viewer.forms else ""
        ident = f'<code class="ident">{escape(a)}</code>'
        return f'<span class="fact" data-atom="{escape(a)}">{out} {ident}{form}</span>'

    def hidden(kind: str, **fields: str) -> str:
        items = {"csrf": viewer.csrf or "", "type": kind, **fields}
        return "".join(f'<input type="hidden" name="{k}" value="{escape(v)}">' for k, v in items.items())

    def value_input(a: str, unknown: bool) -> str:
        atom = atoms.get(a)
        if atom is not None and atom.domain == "bool":
            now = res[a].value if a in res else None  # a correction starts from the other value
            no = " selected" if now is True else ""
            opts = f'<option value="true">yes</option><option value="false"{no}>no</option>'
            if unknown:
                opts += '<option value="unknown">unknown (leave it to the policy)</option>'
            return f'<label>Value <select name="value" required>{opts}</select></label>'
        unit = f" ({escape(atom.unit)})" if atom is not None and atom.unit else ""
        hint = ' placeholder="a number, or unknown"' if unknown else ' placeholder="a number"'
        return f'<label>Value{unit} <input type="text" name="value" required{hint}></label>'

    reason_box = '<label>Reason <textarea name="reason" required maxlength="2000"></textarea></label>'

    def review_form(kind: str, summary: str, fields: str, button: str, **ids: str) -> str:
        """One review form (kind confirm / correct / flag) folded under its summary line."""
        data = "".join(f' data-{k}="{escape(v)}"' for k, v in ids.items())
        return (
            f'<details class="review"><summary>{summary}</summary>'
            f'<form class="review" method="post" action="{escape(action)}" data-review="{kind}"{data}>'
            f"{hidden(kind, **ids)}{fields}{reason_box}"
            f'<button type="submit">{button}</button></form></details>'
        )

    evidence_box = '<label>Evidence (optional) <input type="text" name="evidence" maxlength="2000"></label>'

    def correct_form(a: str) -> str:
        return review_form(
            "correct",
            "Correct this fact",
            value_input(a, unknown=True) + evidence_box,
            "Record the correction",
            atom=a,
        )

    def confirm_form(a: str) -> str:
        if not viewer.forms:
            return ""
        where = "".join(f'<option value="{k}">{escape(v)}</option>' for k, v in ESTABLISHED_TEXT.items())
        established = f'<label>Established <select name="established" required>{where}</select></label>'
        return review_form(
            "confirm",
            "Confirm",
            value_input(a, unknown=False) + established + evidence_box,
            "Record the confirmation",
            atom=a,
        )

    def flag_form(criterion: str) -> str:
        if not viewer.forms:
            return ""
        note = (
            '<label>What is wrong (for the trial owner) <textarea name="note" required maxlength="4000">'
            "</textarea></label>"
        )
        return review_form("flag", "Flag as mis-formalized", note, "Flag the criterion", criterion=criterion)

    decisive = decisive_criteria(decision, patient)
    rows: dict[bool, list[str]] = {True: [], False: []}
    for c in rj["criteria"]:
        ev = [fact(e["atom"]) for e in c["evidence"]]
        ev += [
            f'<span class="fact">open: {what(a)} <code class="ident">{escape(a)}</code></span>'
            for a in c["open"]
        ]
        label = LABEL_TEXT[c["side"]].get(c["label"], escape(c["label"]))
        key = (c["cohort"], c["criterion"])
        formula = formulas.get(key)
        formal = (
            f'<details class="formal"><summary>Formal condition</summary>'
            f"<code>{escape(render(formula, what_plain))}</code>"
            f'<div class="ident">criterion <code>{escape(c["criterion"])}</code>: '
            f"<code>{escape(render(formula))}</code></div></details>"
            if formula is not None
            else ""
        )
        rows[key in decisive].append(
            f'<tr data-criterion="{escape(c["criterion"])}"{" class=decisive" if key in decisive else ""}>'
            f"<td>{escape(c['side'])}</td>"
            f"<td>{escape(c['text'])}{formal}{flag_form(c['criterion'])}</td>"
            f'<td class="label-{escape(c["label"])}">{label}</td>'
            f"<td>{''.join(ev) or '&mdash;'}</td></tr>"
        )

    def table(body: list[str], tid: str) -> str:
        return (
            f'<table id="{tid}"><colgroup><col class="side"><col class="text"><col class="status"><col>'
            "</colgroup>"
            "<thead><tr><th>Side</th><th>Criterion</th><th>Status</th><th>Evidence</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>"
        )

    if rows[True]:
        lead = {
            "ineligible": "The criteria the patient fails:",
            "eligible": "The criteria that rest on assumptions (to confirm at the visit):",
        }.get(d, "The criteria still open:")
        criteria_html = f'<p class="meta" id="decisive-lead">{lead}</p>{table(rows[True], "decisive")}'
        if rows[False]:
            opened = "" if len(rows[False]) > COLLAPSE_OVER else " open"
            criteria_html += (
                f'<details class="other" id="other-criteria"{opened}><summary>The other '
                f"{len(rows[False])} criteria</summary>{table(rows[False], 'other')}</details>"
            )
    else:
        criteria_html = (
            '<p class="meta" id="decisive-lead">Every criterion is settled by the chart:</p>'
            + table(rows[False], "other")
        )

    confirm = [
        f'<li data-atom="{escape(x["atom"])}">{what(x["atom"])}'
        + (f": {escape(x['requirement'])}" if x["requirement"] else "")
        + f" <span class=meta>({escape(x['class'])})</span> <code class=ident>{escape(x['atom'])}</code>"
        + confirm_form(x["atom"])
        + "</li>"
        for x in rj["to_confirm"]
    ]
    seen = {x["atom"] for x in rj["to_confirm"]}
    waiting: list[str] = []  # atoms the chart leaves open that a criterion waits on
    for lb in decision.labels:
        for a in lb.open_atoms:
            if a not in seen and a in atoms:
                seen.add(a)
                waiting.append(
                    f'<li data-atom="{escape(a)}">{what(a)} <span class=meta>(not in the chart; '
                    f"criterion {escape(lb.criterion)} waits on it)</span> "
                    f"<code class=ident>{escape(a)}</code>" + confirm_form(a) + "</li>"
                )
    if len(waiting) > COLLAPSE_OVER:  # a long tail of open conditions: folded, like the other criteria
        waiting = [
            f'<li class="more"><details id="confirm-open"><summary>{len(waiting)} conditions the chart '
            f"leaves open</summary><ul>{''.join(waiting)}</ul></details></li>"
        ]
    confirm += waiting
    if not confirm:
        confirm = ["<li>Nothing: the chart establishes every condition the decision rests on.</li>"]

    change = [f"<li>{escape(x['text'])}</li>" for x in rj["would_change"]]
    if decision.pivotal is not None:
        target = "eligible" if decision.pivotal.direction == "to_eligible" else "ineligible"
        change_title = f"What would make the patient {target}"
        noted = not change  # the note stands in for an empty δ
        if noted:
            change = [f"<li>{escape(decision.pivotal.note or 'No change of the modelled conditions.')}</li>"]
        if decision.pivotal.alternatives:
            change.append(
                f"<li class=meta>{len(decision.pivotal.alternatives)} other minimal way(s) exist.</li>"
            )
        if not noted and rests_on_unasked(decision):  # staged mining: some atoms were never asked
            change.append(f'<li class=meta id="not-asked">{escape(decision.pivotal.note or "")}</li>')
    else:
        change_title = "What would change the decision"
        change = ["<li>Not computed for this decision.</li>"]

    if not docs:
        note_html = (
            "<p class=meta>The note was not kept (store_notes is off): each evidence quote is kept as "
            "its hash and its offset in the note only."
            + (
                ' <span id="unkeyed">These hashes are unkeyed (recorded before keyed hashing): a short '
                "quote can be guessed from them.</span>"
                if quote_hashing(row.artifacts) == "unkeyed"
                else ""
            )
            + "</p>"
        )
    elif not several:
        note_html = f'<div class="note" id="note">{highlighted_note(docs[0]["text"], spans[first])}</div>'
    else:
        meta = {m["id"]: m for m in row.artifacts.get("documents") or []}
        parts = []
        for k, doc in enumerate(docs):
            m = meta.get(doc["id"], {})
            info = ", ".join(str(m[x]) for x in ("kind", "date") if m.get(x))
            head = f"<h3>Document {escape(doc['id'])}"
            head += f" <span class=meta>({escape(info)})</span></h3>" if info else "</h3>"
            body = highlighted_note(doc["text"], spans[doc["id"]], anchors[doc["id"]])
            attrs = f'class="note" id="doc-{k}" data-document="{escape(doc["id"])}"'
            parts.append(f"{head}<div {attrs}>{body}</div>")
        note_html = "".join(parts)
    conflicts = [PassageConflict.model_validate(c) for c in row.artifacts.get("extraction_conflicts") or []]
    conflict_items = [
        f'<li data-atom="{escape(c.atom)}">{escape(c.atom)}: '
        + "; ".join(
            f"document <strong>{escape(f.document)}</strong>: {escape(f.shown(c.atom))} "
            f'<q class="evidence">{escape(f.evidence)}</q>'
            for f in c.findings
        )
        + "</li>"
        for c in conflicts
    ]
    conflicts_html = (
        '<h2>Documents disagree (left open, confirm in the chart)</h2><ul id="conflicts">'
        + "".join(conflict_items)
        + "</ul>"
        if conflict_items
        else ""
    )
    reason = f"<p><strong>Reason:</strong> {escape(decision.reason)}</p>" if decision.reason else ""
    notice_html = f'<p class="banner" id="notice">{escape(notice)}</p>' if notice else ""
    version = TrialVersion.recorded(row.artifacts)
    inactive = version.banner(row.trial_id) if version is not None else None
    notice_html += f'<p class="banner" id="inactive-version">{escape(inactive)}</p>' if inactive else ""
    forms_note = "" if viewer.forms else f'<p class="meta" id="no-forms">{escape(viewer.why_no_forms())}</p>'
    models = row.models
    parser_model = models.get("parser") or "none (an uploaded or revised program)"
    body = f"""{notice_html}
<h1>{escape(program.title or row.trial_id)}</h1>
<p>Patient <strong>{escape(row.patient_id)}</strong> for trial <strong>{escape(row.trial_id)}</strong>:
<span id="decision" class="decision {escape(d)}">{escape(d)}</span></p>
<p id="summary">{escape(decision.trace.summary)}</p>{reason}{history_html(row.decision_id, history, what)}
<h2>Criteria</h2>{forms_note}
<section id="criteria">{criteria_html}</section>
<h2>Patient note</h2>{chart_read_html(row)}{note_html}
{conflicts_html}
<h2>To confirm at the screening visit</h2><ul id="confirm">{"".join(confirm)}</ul>
<h2>{escape(change_title)}</h2><ul id="change">{"".join(change)}</ul>
<h2>Record</h2>
<p class="meta">Decision <span id="decision-id">{escape(row.decision_id)}</span>, {escape(when)}; policy
{escape(row.policy_name)} v{escape(row.policy_version)}; program {escape(row.program_hash)}; value miner
{escape(str(models.get("value_miner")))}, parser {escape(str(parser_model))}, base model
{escape(str(models.get("base_model")))}; engine v{escape(row.engine_version)}.</p>"""
    return shell(f"{row.trial_id} / {row.patient_id}: {d}", body, viewer)


def chart_read_html(row: DecisionRow) -> str:
    """How a long chart was read once (documents -> passages kept, what was not read and why, the
    documents the evidence came from); empty for a chart mined whole."""
    read = row.artifacts.get("chart_read")
    if not read:
        return ""
    return f'<p class="meta" id="chart-read">{escape(ChartRead.model_validate(read).summary())}</p>'


def history_html(decision_id: str, history, what=escape) -> str:
    """The decision's lineage, oldest first, each with the changes that led to it; empty for a
    decision that nothing supersedes and that supersedes nothing."""
    if history is None or (history.total <= 1 and not history.superseded):
        return ""
    items = []
    if history.offset:  # the page shows the newest entries; the rest is a page of the history API
        link = f"/v1/decisions/{escape(decision_id)}/history"
        items.append(f'<li id="earlier">{history.offset} earlier entries: <a href="{link}">{link}</a></li>')
    for e in history.entries:
        when = datetime.fromtimestamp(e.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
        link = (
            f"<strong>{escape(e.decision_id)}</strong> (this page)"
            if e.decision_id == decision_id
            else f'<a href="/v1/decisions/{escape(e.decision_id)}/page">{escape(e.decision_id)}</a>'
        )
        changes = "".join(f"<li>{change_text(c, what)}</li>" for c in e.changes)
        items.append(
            f'<li data-decision="{escape(e.decision_id)}">{link}: <strong>{escape(e.decision)}</strong>, '
            f"{escape(e.kind)}, {escape(when)}, by key {escape(e.created_by)}"
            + (f'<ul class="changes">{changes}</ul>' if changes else "")
            + "</li>"
        )
    newer = ""
    if history.superseded:
        newer = (
            f'<p class="banner" id="superseded">A newer decision supersedes this one: '
            f'<a href="/v1/decisions/{escape(history.current_id)}/page">{escape(history.current_id)}</a>.</p>'
        )
    return f'{newer}<h2>History</h2><ol id="history">{"".join(items)}</ol>'


def change_text(c, what=escape) -> str:
    """One recorded change (verdict.serve.reviews RecordedChange), in words; `what` gives an atom's readable
    name (escaped), the identifier follows as a detail."""
    name = c.atom or c.criterion or ""
    shown = f"{what(c.atom)} " if c.atom else ""
    what = f'{shown}<code class="ident">{escape(name)}</code>'
    value = "unknown" if c.value is None else _val(c.value)
    if c.type == "confirm":
        where = ESTABLISHED_TEXT.get(c.established or "", c.established or "")
        head = f"confirmed {what} = {escape(value)} {escape(where)}"
    elif c.type == "correct":
        head = f"corrected {what} to {escape(value)}"
    elif c.type == "flag":
        head = f"flagged criterion {what}: {escape(c.note or '')}"
    else:
        head = f"re-screened ({escape(json.dumps(c.details or {}, sort_keys=True))})"
    tail = f"; reason: {escape(c.reason)} (key {escape(c.reviewer)})"
    return f'<span data-change="{escape(c.type)}">{head}{tail}</span>'


def stored_documents(row: DecisionRow) -> list[dict]:
    """The stored patient text as documents [{id, text}]: a `notes` request stored them as a JSON
    list (its `documents` artifact says so); a single note is the one document 'note'."""
    if row.note_text is None:
        return []
    if row.artifacts.get("documents") is not None:
        return [{"id": str(d["id"]), "text": str(d["text"])} for d in json.loads(row.note_text)]
    return [{"id": "note", "text": row.note_text}]


def _val(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:g}" if isinstance(v, float) else str(v)
