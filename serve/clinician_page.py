"""The clinician's view of one decision, as a self-contained HTML page (no scripts, no external
resources): the decision, each criterion with its evidence highlighted in the note, what to confirm
at the screening visit, and what would change the decision.

Everything shown is restated from the audit record (decision, resolved patient, program); nothing
is decided here. Every piece of text is HTML-escaped: notes and criteria are data, never markup.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from html import escape

from data_gen.formalizer.miner import PassageConflict
from verdict_core.decision import Decision
from verdict_core.patient import ResolvedPatient
from verdict_core.program import TrialProgram
from verdict_core.rationale import rationale_json

from .audit import DecisionRow

# Worded per side: an exclusion criterion "met" would read as "the patient has the excluding condition".
LABEL_TEXT = {
    "inclusion": {"satisfied": "met", "violated": "not met", "deferred": "open"},
    "exclusion": {"satisfied": "does not apply", "violated": "applies: excludes", "deferred": "open"},
}
_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)\s*")

_CSS = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1b1b1b;
line-height:1.45}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.8rem;border-bottom:1px solid #ddd}
.decision{display:inline-block;padding:.2rem .7rem;border-radius:.3rem;font-weight:700;
text-transform:uppercase}
.eligible{background:#d8f3dc;color:#1b4332}.ineligible{background:#ffd6d6;color:#7a0000}
.undetermined{background:#fff3bf;color:#5c4400}
table{border-collapse:collapse;width:100%}
td,th{border:1px solid #ddd;padding:.35rem .5rem;vertical-align:top;text-align:left}
.label-satisfied{color:#1b4332;font-weight:600}.label-violated{color:#7a0000;font-weight:600}
.label-deferred{color:#5c4400;font-weight:600}
.note{white-space:pre-wrap;background:#fafafa;border:1px solid #ddd;padding:.8rem;
font-family:ui-monospace,monospace}
mark{background:#ffe066;padding:0 .1rem}.meta{color:#555;font-size:.9rem}
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


def render_page(row: DecisionRow, program: TrialProgram) -> str:
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
    d = decision.decision
    when = datetime.fromtimestamp(row.created_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    def fact(a: str) -> str:
        r = res.get(a)
        if r is None:
            return escape(a)
        shown = r.bounds.text(a) if r.bounds else f"{a} = {_val(r.value)}"
        if r.status == "observed" and r.evidence:
            where = f"in {source_of[a]}" if several and a in source_of else "in the note"
            ref = f' <a href="#{span_of[a]}">{escape(where)}</a>' if a in span_of else ""
            return f'{escape(shown)}: <q class="evidence">{escape(r.evidence)}</q>{ref}'
        if r.status == "imputed" and r.imputation:
            return (
                f"{escape(shown)} (imputed by policy rule <code>{escape(r.imputation.rule)}</code>: "
                f"{escape(r.imputation.reason)})"
            )
        return escape(shown)

    rows = []
    for c in rj["criteria"]:
        ev = [fact(e["atom"]) for e in c["evidence"]]
        ev += [f"open: {escape(atoms[a].definition) if a in atoms else escape(a)}" for a in c["open"]]
        label = LABEL_TEXT[c["side"]].get(c["label"], escape(c["label"]))
        rows.append(
            f'<tr data-criterion="{escape(c["criterion"])}"><td>{escape(c["side"])}</td>'
            f"<td>{escape(c['text'])}</td>"
            f'<td class="label-{escape(c["label"])}">{label}</td>'
            f"<td>{'<br>'.join(ev) or '&mdash;'}</td></tr>"
        )

    confirm = [
        f"<li>{escape(x['definition'])}"
        + (f": {escape(x['requirement'])}" if x["requirement"] else "")
        + f" <span class=meta>({escape(x['class'])})</span></li>"
        for x in rj["to_confirm"]
    ]
    seen = {x["atom"] for x in rj["to_confirm"]}
    for lb in decision.labels:
        for a in lb.open_atoms:
            if a not in seen and a in atoms:
                seen.add(a)
                confirm.append(
                    f"<li>{escape(atoms[a].definition)} <span class=meta>(not in the chart; "
                    f"criterion {escape(lb.criterion)} waits on it)</span></li>"
                )
    if not confirm:
        confirm = ["<li>Nothing: the chart establishes every condition the decision rests on.</li>"]

    change = [f"<li>{escape(x['text'])}</li>" for x in rj["would_change"]]
    if decision.pivotal is not None:
        target = "eligible" if decision.pivotal.direction == "to_eligible" else "ineligible"
        change_title = f"What would make the patient {target}"
        if not change:
            change = [f"<li>{escape(decision.pivotal.note or 'No change of the modelled conditions.')}</li>"]
        if decision.pivotal.alternatives:
            change.append(
                f"<li class=meta>{len(decision.pivotal.alternatives)} other minimal way(s) exist.</li>"
            )
    else:
        change_title = "What would change the decision"
        change = ["<li>Not computed for this decision.</li>"]

    if not docs:
        note_html = (
            "<p class=meta>The note was not kept (store_notes is off): each evidence quote is kept as "
            "its hash and its offset in the note only.</p>"
        )
    elif not several:
        note_html = f'<div class="note" id="note">{highlighted_note(docs[0]["text"], spans[first])}</div>'
    else:
        meta = {m["id"]: m for m in row.artifacts.get("documents") or []}
        parts = []
        for k, doc in enumerate(docs):
            m = meta.get(doc["id"], {})
            info = ", ".join(str(m[x]) for x in ("kind", "date") if m.get(x))
            head = f'<h3>Document {escape(doc["id"])}'
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
        + "".join(conflict_items) + "</ul>"
        if conflict_items
        else ""
    )
    reason = f"<p><strong>Reason:</strong> {escape(decision.reason)}</p>" if decision.reason else ""
    models = row.models
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{escape(row.trial_id)} / {escape(row.patient_id)}: {escape(d)}</title><style>{_CSS}</style></head>
<body>
<h1>{escape(program.title or row.trial_id)}</h1>
<p>Patient <strong>{escape(row.patient_id)}</strong> for trial <strong>{escape(row.trial_id)}</strong>:
<span id="decision" class="decision {escape(d)}">{escape(d)}</span></p>
<p id="summary">{escape(decision.trace.summary)}</p>{reason}
<h2>Criteria</h2>
<table id="criteria"><thead><tr><th>Side</th><th>Criterion</th><th>Status</th><th>Evidence</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
<h2>Patient note</h2>{note_html}
{conflicts_html}
<h2>To confirm at the screening visit</h2><ul id="confirm">{"".join(confirm)}</ul>
<h2>{escape(change_title)}</h2><ul id="change">{"".join(change)}</ul>
<h2>Record</h2>
<p class="meta">Decision {escape(row.decision_id)}, {escape(when)}; policy {escape(row.policy_name)}
v{escape(row.policy_version)}; program {escape(row.program_hash)}; value miner
{escape(str(models.get("value_miner")))}, parser {escape(str(models.get("parser")))}, base model
{escape(str(models.get("base_model")))}; engine v{escape(row.engine_version)}.</p>
</body></html>
"""


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
