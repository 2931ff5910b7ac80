"""Cost of value mining against chart length: the chart read once (issue 23) vs mined whole, no model.

    .venv/bin/python benchmarks/miner_calls.py [--limits paper] [--sizes 500,2000,8000,22000,128000]
        [--programs 3] [--trials 300] [--shared ../shared/data]

Charts of about 0.5k / 2k / 8k / 22k / 128k real Qwen2.5 tokens of DISTINCT text: the shared SIGIR
and TREC patient texts (`benchmarks/patients_*.jsonl`, one document each, about 22k tokens in
all), then the shared trials' criteria texts as filler documents (paragraphs seen before are left
out, so de-duplication removes nothing; documents that add no fact about the patient). Document
selection is off: every document is read, once.

Both paths are planned with the product's planning functions under a student's limits
(`configs/limits/NAME.yaml`), every prompt counted with the real tokenizer:

- **before** (today's path, the reader disabled): `plan_miner_calls` over the whole chart.
- **after**: `reduce_chart`, `plan_reader_calls` (the one reading per patient), then
  `plan_miner_calls` over the fact sheet. A chart at most `read_above_tokens` is mined whole.

The fact sheet is what the scripted reader keeps (a reader that misses nothing it is shown): of a
SIGIR patient text, the pieces of every evidence quote the reference corpus recorded for that
patient (`reference/v6`) verbatim in the passage; of a TREC patient text (no recording), its
leading sentences up to the SIGIR excerpt share (printed); of filler, nothing. Per pair: calls and
prompt tokens of both sides for one trial program, the reading amortized over `--trials` trials.
Completion tokens are estimated from the recorded share of non-null values (23%) and the mean
recorded quote: a sparse answer (the default miner prompt, v2) writes only those value lines, a
dense one (v1) a line for every atom; a reader call writes its excerpts.

Then a projection: GPU-hours to screen 10,000 patients x 300 trials with 20k-token charts, both
paths, at stated prefill/decode rates, against the share of pairs a first stage (the exclusion
side) settles. The last line: `chart-cost: program=ID calls_2k=A calls_128k=B prompt_2k=C
prompt_128k=D` (the largest program, per pair, reading amortized; the sizes nearest 2k and 128k).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Stated rates for a 7-9B dense model served by vLLM on one H100 80GB, aggregate over a full batch.
# Source: GPUStack performance lab, "Optimizing Qwen3.5-9B Throughput" on H100 with vLLM
# (docs.gpustack.ai/latest/performance-lab/qwen3.5-9b/h100): long-context profile (prefill-bound)
# about 32,400 total tokens/s, generation-heavy profile about 3,000 total tokens/s. A 7B model is
# somewhat faster; these are round, conservative figures.
PREFILL_TOKENS_PER_S = 30_000
DECODE_TOKENS_PER_S = 3_000
NON_NULL_SHARE = 0.23  # recorded atom values that are not null or a silence default (reference corpus)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def largest_programs(shared: Path, n: int):
    from verdict.core.reference import load_reference

    progs = {}
    for path in sorted((shared / "reference" / "v6").glob("*/*__full.json")):
        p = load_reference(path).program
        progs.setdefault(p.trial_id, p)  # one program per trial
    return sorted(progs.values(), key=lambda p: -len(p.atoms))[:n]


def recorded_quotes(shared: Path) -> dict[str, list[tuple[str, str, str]]]:
    """patient id -> (evidence quote, the atom citing it, its trial) the reference corpus recorded
    for that patient (every trial)."""
    from verdict.core.reference import load_reference

    out: dict[str, list[tuple[str, str, str]]] = {}
    for path in sorted((shared / "reference" / "v6").glob("*/*__full.json")):
        case = load_reference(path)
        q = out.setdefault(path.parent.name, [])
        q += [(r.evidence, r.atom, case.program.trial_id) for r in case.patient.resolutions if r.evidence]
    return out


def patient_texts(shared: Path) -> list[tuple[str, str]]:
    out = []
    for name in ("patients_sigir.jsonl", "patients_trec2021.jsonl"):
        for line in (shared / "benchmarks" / name).read_text().splitlines():
            row = json.loads(line)
            out.append((row["_id"], row["text"]))
    return out


def filler_texts(shared: Path):
    """Trial criteria texts, one document each, paragraphs seen before left out (distinct text)."""
    from verdict.data_gen.formalizer import normalize_ws, paragraph_spans

    seen: set[str] = set()
    for name in ("trials.jsonl", "trials_judged0_only.jsonl"):
        for line in (shared / "benchmarks" / name).read_text().splitlines():
            row = json.loads(line)
            text = row.get("criteria") or "\n\n".join(
                x for x in (row.get("inclusion"), row.get("exclusion")) if x
            )
            paras = []
            for s, e in paragraph_spans(text):
                key = normalize_ws(text[s:e])
                if key and key not in seen:
                    seen.add(key)
                    paras.append(text[s:e])
            if paras:
                yield f"trial-{row['nct_id']}", "\n\n".join(paras)


def chart_of(size: int, shared: Path, counter, facts: int | None = None):
    """Documents adding up to at least `size` tokens: patient texts (at most about `facts` tokens of
    them when given), then filler."""
    from verdict.data_gen.formalizer import NoteDocument

    docs, total = [], 0
    for kind, source in (("patient", patient_texts(shared)), ("filler", filler_texts(shared))):
        for did, text in source:
            if total >= size:
                return docs, total
            if kind == "patient" and facts is not None and total >= facts:
                break
            docs.append(NoteDocument(id=did, text=text, kind=kind))
            total += counter.count_text(text)
    return docs, total


def excerpt_share(quotes: dict[str, list[str]], texts: dict[str, str], counter) -> float:
    """Tokens the scripted reader keeps of the recorded SIGIR patients' texts, over their tokens."""
    from verdict.data_gen.formalizer import normalize_ws, split_pieces

    kept = total = 0
    for pid, qs in quotes.items():
        if pid not in texts:
            continue
        hay = normalize_ws(texts[pid])
        pieces = {p for q, _, _ in qs for p in split_pieces(q) if p in hay}
        kept += sum(counter.count_text(p) for p in pieces)
        total += counter.count_text(texts[pid])
    return kept / total if total else 0.0


def scripted_excerpts(call, quotes, share, counter, terms_of=None):
    """What a reader that misses nothing it is shown keeps of one reader call (see the docstring).
    `terms_of(patient, excerpt)`: the terms it writes for an excerpt (None: none)."""
    from verdict.data_gen.formalizer import Excerpt, locate, normalize_ws, split_pieces

    out = []
    for p in call.passages:
        if p.document.startswith("trial-"):
            continue  # filler: nothing about the patient
        if p.document in quotes:
            hay = normalize_ws(p.text)
            pieces = dict.fromkeys(x for q, _, _ in quotes[p.document] for x in split_pieces(q) if x in hay)
        else:  # no recording: the leading sentences up to the measured share
            pieces, used, goal = {}, 0, share * counter.count_text(p.text)
            for s in _SENTENCE.split(p.text):
                if used >= goal:
                    break
                pieces[s] = None
                used += counter.count_text(s)
        for x in pieces:
            at = locate(x, p.text)
            if at is not None:
                terms = terms_of(p.document, x) if terms_of and p.document in quotes else []
                out.append(Excerpt(document=p.document, offset=p.start + at, text=x, terms=terms))
    return out


@dataclass
class Cost:
    calls: float = 0.0
    prompt: float = 0.0
    completion: float = 0.0

    def plus(self, other: Cost, weight: float = 1.0) -> Cost:
        return Cost(
            self.calls + weight * other.calls,
            self.prompt + weight * other.prompt,
            self.completion + weight * other.completion,
        )


QUOTE_TOKENS = 12.0  # replaced in main() by the mean recorded evidence quote, in tokens


def route_of(prog, router):
    """The product's routing of a fact sheet (`mine_chart`), for the planner."""
    if router is None:
        return None
    from verdict.data_gen.formalizer import ChartReading, sheet_route

    return sheet_route(prog, router, ChartReading())


def mining_cost(prog, docs, limits, counter, side_only: str | None = None, router=None) -> Cost:
    """Both sides' (or one side's) planned miner calls over these documents (a fact sheet: routed
    by `router` as the product routes it)."""
    from verdict.data_gen.formalizer import compact, plan_miner_calls, stage_prompt

    def null_line(a: str) -> int:
        return counter.count_text(compact({"atom": a, "value": None, "evidence": ""}) + ",")

    cost = Cost()
    for side in (side_only,) if side_only else ("inclusion", "exclusion"):
        stage = f"miner_{side}"
        calls = plan_miner_calls(
            prog,
            docs,
            side,
            count_messages=counter.count_messages,
            count_text=counter.count_text,
            prompt_budget=limits.prompt_budget(stage),
            completion_budget=limits.stage_tokens(stage),
            route=route_of(prog, router),
        )
        sparse = stage_prompt(stage).sparse  # the default miner prompt: sparse answers name only values
        for c in calls:
            lines = sum(null_line(a) for a in c.atoms)
            said = NON_NULL_SHARE * (lines + len(c.atoms) * QUOTE_TOKENS)
            cost = cost.plus(
                Cost(1, c.prompt_tokens, said if sparse else lines + said - NON_NULL_SHARE * lines)
            )
    return cost


def terms_from(quotes, leave_out: str | None = None):
    """The scripted reader's terms for an excerpt: `reader.recorded_terms` over the patient's
    recorded (quote, atom) pairs, leaving out one trial's atoms when asked (so an atom's own name
    never routes its own evidence)."""
    from verdict.data_gen.formalizer import recorded_terms

    def terms_of(pid: str, excerpt: str) -> list[str]:
        cited = [(q, a) for q, a, t in quotes.get(pid, []) if t != leave_out]
        return recorded_terms(excerpt, cited)

    return terms_of


def reading(docs, limits, counter, quotes, share, terms_of=None):
    """The one reading of a chart: its cost, the fact sheet's documents and its router."""
    from verdict.data_gen.formalizer import ChartRead, FactSheet, SheetRouter, plan_reader_calls, reduce_chart

    reduced = reduce_chart(docs)
    calls = plan_reader_calls(
        reduced.documents,
        count_messages=counter.count_messages,
        count_text=counter.count_text,
        prompt_budget=limits.prompt_budget("reader"),
        completion_budget=limits.stage_tokens("reader"),
    )
    cost, excerpts = Cost(), []
    terms_of = terms_of or terms_from(quotes)
    for c in calls:
        got = scripted_excerpts(c, quotes, share, counter, terms_of)
        excerpts += got
        items = [{"text": e.text, "terms": e.terms} for e in got]
        out = json.dumps({"excerpts": items}, ensure_ascii=False)
        cost = cost.plus(Cost(1, counter.count_messages(c.messages), counter.count_text(out)))
    sheet = FactSheet(excerpts, ChartRead(documents=len(docs)))
    return cost, sheet.documents(), reduced, SheetRouter.build(excerpts, counter.count_text)


def pair_cost(prog, docs, limits, counter, quotes, share, trials, threshold):
    """(before, after per pair with the reading amortized, the reading alone, sheet tokens)."""
    before = mining_cost(prog, docs, limits, counter)
    chart_tokens = sum(counter.count_text(d.text) for d in docs)
    if chart_tokens <= threshold:
        return before, before, Cost(), chart_tokens, None
    read, sheet_docs, reduced, router = reading(docs, limits, counter, quotes, share)
    after = mining_cost(prog, sheet_docs, limits, counter, router=router) if sheet_docs else Cost()
    sheet_tokens = sum(counter.count_text(d.text) for d in sheet_docs)
    return before, after.plus(read, 1 / trials), read, sheet_tokens, reduced


def fixed_facts(prog, sizes, limits, counter, quotes, share, threshold, a) -> None:
    """The same, the patient texts stopped at about `--fixed-facts` tokens and the rest filler: one
    patient's facts in a chart that grows (what the reading makes flat)."""
    print()
    print(f"patient text fixed at about {a.fixed_facts} tokens, the rest filler (program {prog.trial_id}):")
    print(f"{'chart':>8}{'docs':>6}{'sheet':>7}{'calls after':>12}{'prompt after':>13}{'read calls':>11}")
    for size in sizes:
        if size < a.fixed_facts:
            continue
        docs, tokens = chart_of(size, a.shared, counter, facts=a.fixed_facts)
        chart_tokens = sum(counter.count_text(d.text) for d in docs)
        if chart_tokens <= threshold:
            after, read, sheet = mining_cost(prog, docs, limits, counter), Cost(), chart_tokens
        else:
            read, sheet_docs, _, router = reading(docs, limits, counter, quotes, share)
            after = (
                mining_cost(prog, sheet_docs, limits, counter, router=router) if sheet_docs else Cost()
            ).plus(read, 1 / a.trials)
            sheet = sum(counter.count_text(d.text) for d in sheet_docs)
        print(
            f"{tokens:>8}{len(docs):>6}{sheet:>7}{after.calls:>12.1f}{after.prompt:>13,.0f}{read.calls:>11.0f}"
        )


def routing_recall(limits, counter, quotes, share, shared: Path, size: int) -> None:
    """Of the recorded evidence of the reference pairs, the share a routed miner call is shown:
    the 76 pairs' programs against the fact sheet of the `size`-token chart (every shared patient's
    excerpts: one patient's evidence among about 130 patients' facts, harder than one chart), each
    atom with an observed value whose quote is on the sheet counted once. Three scripted readers:
    no terms (the excerpt's words only), terms from the atoms of the patient's OTHER trials (a
    reader that names what it reads, never this trial's own atom names), and terms from every
    trial's atoms (an upper bound: this trial's atom names route its own evidence)."""
    from verdict.core.reference import load_reference
    from verdict.data_gen.formalizer import (
        SheetRouter,
        normalize_ws,
        plan_miner_calls,
        side_atoms,
        split_pieces,
    )

    docs, tokens = chart_of(size, shared, counter)
    _, _, _, base = reading(docs, limits, counter, quotes, share, lambda pid, x: [])
    cases = [
        (path.parent.name, load_reference(path))
        for path in sorted((shared / "reference" / "v6").glob("*/*__full.json"))
    ]

    def variant(terms_of):
        ex = [e.model_copy(update={"terms": terms_of(e.document, e.text)}) for e in base.excerpts]
        return SheetRouter.build(ex, counter.count_text)

    rows = {"no terms": lambda trial: variant(lambda pid, x: [])}
    rows["terms of other trials"] = lambda trial: variant(terms_from(quotes, leave_out=trial))
    rows["terms of every trial"] = lambda trial: variant(terms_from(quotes))
    on_sheet = {
        e.document: " ".join(normalize_ws(x.text) for x in base.excerpts if x.document == e.document)
        for e in base.excerpts
    }
    print()
    print(
        f"routing recall: reference evidence shown to its atom's routed call, {tokens:,}-token chart's sheet"
    )
    for label, make in rows.items():
        shown = total = 0
        cache = {}
        for pid, case in cases:
            trial = case.program.trial_id
            if trial not in cache:
                cache = {trial: make(trial)}  # cases come grouped by patient, not by trial
            router = cache[trial]
            for side in ("inclusion", "exclusion"):
                names = side_atoms(case.program, side)
                calls = plan_miner_calls(
                    case.program,
                    router.documents(list(range(len(router.excerpts)))),
                    side,
                    count_messages=counter.count_messages,
                    count_text=counter.count_text,
                    prompt_budget=limits.prompt_budget(f"miner_{side}"),
                    completion_budget=limits.stage_tokens(f"miner_{side}"),
                    route=route_of(case.program, router),
                )
                for r in case.patient.resolutions:
                    if r.status != "observed" or not r.evidence or r.atom not in names:
                        continue
                    pieces = [normalize_ws(x) for x in split_pieces(r.evidence)]
                    if not pieces or not all(x in on_sheet.get(pid, "") for x in pieces):
                        continue
                    total += 1
                    seen = " ".join(normalize_ws(t) for c in calls if r.atom in c.atoms for t in c.texts)
                    shown += all(x in seen for x in pieces)
        print(f"  {label:<24} {shown}/{total} = {shown / max(1, total):.1%}")


def projection(prog, limits, counter, quotes, share, trials, threshold, shared, a) -> None:
    """GPU-hours to screen 10,000 patients x 300 trials with 20k-token charts."""
    docs, tokens = chart_of(20_000, shared, counter)
    patients, n_trials = 10_000, 300
    before_exc = mining_cost(prog, docs, limits, counter, "exclusion")
    before_inc = mining_cost(prog, docs, limits, counter, "inclusion")
    read, sheet_docs, _, router = reading(docs, limits, counter, quotes, share)
    after_exc = mining_cost(prog, sheet_docs, limits, counter, "exclusion", router)
    after_inc = mining_cost(prog, sheet_docs, limits, counter, "inclusion", router)

    def hours(c: Cost, n: float) -> float:
        return n * (c.prompt / a.prefill_rate + c.completion / a.decode_rate) / 3600

    pairs = patients * n_trials
    print()
    print(
        f"projection: {patients:,} patients x {n_trials} trials, {tokens:,}-token charts ({len(docs)} "
        f"documents), program {prog.trial_id}; one GPU at {a.prefill_rate:,} prefill and "
        f"{a.decode_rate:,} decode tokens/s (vLLM, 7-9B dense model, H100; GPUStack performance lab, "
        "Qwen3.5-9B on H100)"
    )
    print(f"  reading once per patient: {hours(read, patients):,.0f} GPU-hours in all")
    print(f"{'settled by stage 1':>20}{'today GPU-h':>14}{'read once GPU-h':>17}{'ratio':>8}")
    for s in (0.0, 0.25, 0.5, 0.75, 0.9):
        today = hours(before_exc, pairs) + hours(before_inc, pairs * (1 - s))
        new = hours(read, patients) + hours(after_exc, pairs) + hours(after_inc, pairs * (1 - s))
        print(f"{s:>20.2f}{today:>14,.0f}{new:>17,.0f}{today / new:>8.1f}")
    print("  stage 1 = the exclusion side; a pair it settles (ineligible) skips the inclusion side")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limits", default="paper", help="configs/limits/NAME.yaml (default: paper)")
    ap.add_argument(
        "--sizes", default="500,2000,8000,22000,128000", help="chart sizes in real Qwen2.5 tokens"
    )
    ap.add_argument("--programs", type=int, default=3, help="how many of the largest reference programs")
    ap.add_argument("--trials", type=int, default=300, help="trials a patient's reading is amortized over")
    ap.add_argument(
        "--shared", type=Path, default=REPO.parent / "shared" / "data", help="the shared data folder"
    )
    ap.add_argument("--prefill-rate", type=int, default=PREFILL_TOKENS_PER_S, help="prompt tokens/s, one GPU")
    ap.add_argument(
        "--decode-rate", type=int, default=DECODE_TOKENS_PER_S, help="completion tokens/s, one GPU"
    )
    ap.add_argument("--no-projection", action="store_true")
    ap.add_argument(
        "--recall",
        type=int,
        default=22000,
        help="routing recall of the reference evidence on this chart size's fact sheet (0: off)",
    )
    ap.add_argument(
        "--fixed-facts",
        type=int,
        default=2000,
        help="also: charts whose patient text stops at about this many tokens, the rest filler (0: off)",
    )
    a = ap.parse_args(argv)

    from verdict.data_gen.formalizer import ChartReading, load_limits, qwen25_counter, side_atoms

    limits = load_limits(a.limits)
    counter = qwen25_counter()  # the real vocabulary, whatever the limits' tokenizer is
    threshold = ChartReading().read_above_tokens
    quotes = recorded_quotes(a.shared)
    texts = dict(patient_texts(a.shared))
    share = excerpt_share(quotes, texts, counter)
    global QUOTE_TOKENS
    every = [q for qs in quotes.values() for q, _, _ in qs]
    QUOTE_TOKENS = sum(counter.count_text(q) for q in every) / max(1, len(every))
    sizes = [int(x) for x in a.sizes.split(",")]
    charts = [(size, *chart_of(size, a.shared, counter)) for size in sizes]
    programs = largest_programs(a.shared, a.programs)
    print(
        f"limits {limits.name}: max_length {limits.max_length}, tokenizer {counter.name}; read above "
        f"{threshold} tokens; reading amortized over {a.trials} trials; scripted reader keeps "
        f"{share:.1%} of a recorded SIGIR patient text"
    )
    print(
        f"{'program':<14}{'atoms':>6}{'chart':>8}{'docs':>6}{'dedup':>6}{'sheet':>7}"
        f"{'calls before':>13}{'after':>8}{'prompt before':>14}{'after':>10}"
        f"{'read calls':>11}{'read prompt':>12}{'read compl.':>12}"
    )
    first: dict[int, Cost] = {}
    for prog in programs:
        n_atoms = len(set(side_atoms(prog, "inclusion")) | set(side_atoms(prog, "exclusion")))
        for size, docs, tokens in charts:
            before, after, read, sheet, reduced = pair_cost(
                prog, docs, limits, counter, quotes, share, a.trials, threshold
            )
            removed = "-" if reduced is None else str(len(reduced.dropped) + len(reduced.trimmed))
            print(
                f"{prog.trial_id:<14}{n_atoms:>6}{tokens:>8}{len(docs):>6}{removed:>6}{sheet:>7}"
                f"{before.calls:>13.0f}{after.calls:>8.1f}{before.prompt:>14,.0f}{after.prompt:>10,.0f}"
                f"{read.calls:>11.0f}{read.prompt:>12,.0f}{read.completion:>12,.0f}"
            )
            if prog is programs[0]:
                first[size] = after
    if a.fixed_facts:
        fixed_facts(programs[0], sizes, limits, counter, quotes, share, threshold, a)
    if a.recall:
        routing_recall(limits, counter, quotes, share, a.shared, a.recall)
    if not a.no_projection:
        projection(programs[0], limits, counter, quotes, share, a.trials, threshold, a.shared, a)
    lo = min(sizes, key=lambda s: abs(s - 2000))
    hi = min(sizes, key=lambda s: abs(s - 128_000))
    print(
        f"chart-cost: program={programs[0].trial_id} calls_2k={first[lo].calls:.1f} "
        f"calls_128k={first[hi].calls:.1f} prompt_2k={first[lo].prompt:.0f} "
        f"prompt_128k={first[hi].prompt:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
