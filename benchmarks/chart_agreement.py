"""The 76 reference pairs, single note and in a long chart: same decisions, and completion tokens
before (v1 dense answers, exhaustive mining, the chart mined whole) and after (v2 sparse answers,
staged mining, the chart read once).

    .venv/bin/python benchmarks/chart_agreement.py [--chart-tokens 8000] [--policy prescreen]

Each reference file (`../shared/data/reference/v6/<patient>/<trial>__full.json`) is a pair: the
recorded program and the values the authors' miner read from the SIGIR note
(`patients_sigir.jsonl`). A scripted OpenAI-compatible server (real HTTP) replays those values
(`verdict.data_gen.recorded.recorded_answer`), each only when its recorded quote is in the text it
was sent (`only_quoted`): a miner that misses nothing it is shown. As the chart reader it answers the
pieces of the patient's recorded quotes (over all of the patient's pairs) that the passage holds.
Usage is counted with the real Qwen2.5 tokenizer.

The long chart: the note among documents that add no fact about the patient, namely the criteria
text of other trials (`trials.jsonl`, trials of none of the reference pairs, distinct texts, so
de-duplication removes none, and none holding a piece of any recorded quote), about
`--chart-tokens` in all, the note in the middle.

Runs, each decision under the same policy: (1) single note, v1, exhaustive: the reference; (2)
single note, v2, exhaustive; (3) single note, v2, staged; (4) long chart, v1, exhaustive, mined
whole (today's path); (5) long chart, v2, staged, read once. Printed per run: pairs, decisions equal
to (1), calls and completion tokens per pair; the staged runs also count the pairs the first stage
settled and check their decisions equal the exhaustive ones. Last lines:
`completion-tokens: pairs=P v1_per_pair=A v2_per_pair=B` (single note) and
`chart-agreement: pairs=P same_decisions=S completion_tokens_before=X completion_tokens_after=Y`
(run 5 against run 1; tokens per pair, runs 4 and 5, the reading's counted in full).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"
READER_MARK = "You read part of a patient's chart"
REFUSED: list[str] = []  # recorded value lines our check refuses (not replayed)


@dataclass
class Pair:
    patient_id: str
    program: object
    note: str
    values: dict[str, dict]  # atom -> recorded value line (observed values only)


@dataclass
class Run:
    name: str
    decisions: dict[int, str] = field(default_factory=dict)
    calls: int = 0
    completion: int = 0
    settled: list[int] = field(default_factory=list)


def load_pairs() -> list[Pair]:
    from verdict.core.reference import load_reference
    from verdict.data_gen.formalizer import check_miner_output, compact, side_atoms
    from verdict.data_gen.recorded import fit_to_grammar, recorded_answer

    notes = {}
    for line in (SHARED / "benchmarks" / "patients_sigir.jsonl").read_text().splitlines():
        row = json.loads(line)
        notes[row["_id"]] = row["text"]
    out = []
    for f in sorted((SHARED / "reference" / "v6").glob("*/*__full.json")):
        case = fit_to_grammar(load_reference(f))
        note = notes[f.parent.name]
        values = {}
        for side in ("inclusion", "exclusion"):
            answer = recorded_answer(case, side, side_atoms(case.program, side), note, sparse=True)
            for v in json.loads(answer)["values"]:
                # a recorded line our check refuses (a quote not in the note, a wrong type) is left out,
                # as the recorded import leaves its record out: counted, never replayed
                line = compact({"values": [v]})
                if check_miner_output(
                    line, "stop", case.program, [v["atom"]], note, max_tokens=0, sparse=True
                ).ok:
                    values[v.pop("atom")] = v
                else:
                    REFUSED.append(f"{f.parent.name}/{f.name}:{v['atom']}")
        out.append(Pair(f.parent.name, case.program, note, values))
    return out


def filler(exclude: set[str], tokens: int, count, quotes: set[str]) -> list:
    """Other trials' criteria texts, distinct, about `tokens` tokens in all; none holds a piece of a
    recorded quote (`quotes`: it would put the patient's quoted words elsewhere in the chart)."""
    from verdict.data_gen.formalizer.checks import normalize_ws, split_pieces
    from verdict.data_gen.protocol import NoteDocument

    pieces = {p for q in quotes for p in split_pieces(q)}
    docs, total, seen = [], 0, set()
    for line in (SHARED / "benchmarks" / "trials.jsonl").read_text().splitlines():
        t = json.loads(line)
        text = f"{t['title']}\n\n{t.get('inclusion') or ''}\n\n{t.get('exclusion') or ''}".strip()
        if t["nct_id"] in exclude or text in seen or count(text) > 1500:
            continue
        flat = normalize_ws(text)
        if any(p in flat for p in pieces):
            continue
        seen.add(text)
        docs.append(NoteDocument(id=f"doc-{t['nct_id']}", text=text, kind="other_trial"))
        total += count(text)
        if total >= tokens:
            break
    return docs


def chart_of(pair: Pair, docs: list) -> object:
    from verdict.data_gen.protocol import NoteDocument, PatientDoc

    mid = len(docs) // 2
    note = NoteDocument(id="note", text=pair.note, kind="admission_note")
    return PatientDoc(patient_id=pair.patient_id, documents=[*docs[:mid], note, *docs[mid:]])


def script(pair: Pair, quotes: list[str], sparse: bool):
    from verdict.data_gen.scripted_server import Match, Rule, Script
    from verdict.data_gen.scripted_server import ScriptedResponse as R

    return Script(
        rules=[
            Rule(match=Match(contains=[READER_MARK]), responses=[R(auto="excerpts", auto_excerpts=quotes)])
        ],
        default=R(auto="sparse" if sparse else "nulls", auto_values=pair.values, only_quoted=True),
    )


async def run(name, pairs, srv, qwen, policy, *, version, staged, chart=None, reading=False) -> Run:
    from verdict.core.engine import Engine
    from verdict.data_gen.formalizer import Formalizer
    from verdict.data_gen.formalizer.reader import ChartReading
    from verdict.data_gen.formalizer.staged import decide_pair
    from verdict.data_gen.protocol import PatientDoc
    from verdict.data_gen.teacher_config import TeacherConfig

    teacher = TeacherConfig(
        name="scripted",
        base_url=srv.url,
        model="recorded",
        timeout_s=30,
        max_retries=0,
        limits="paper",  # the students' limits: 4,096-token calls, 1,536 new tokens per miner call
    )
    quotes: dict[str, list[str]] = {}
    for p in pairs:
        quotes.setdefault(p.patient_id, []).extend(
            v["evidence"] for v in p.values.values() if v.get("evidence")
        )
    engine, out = Engine(), Run(name)
    prompts = {"miner_inclusion": version, "miner_exclusion": version}
    fz = Formalizer(teacher, prompts=prompts, reading=ChartReading(enabled=reading), engine=engine)
    try:
        for i, p in enumerate(pairs):
            srv.set_script(script(p, quotes[p.patient_id], sparse=version != "v1"))
            record = chart(p) if chart else PatientDoc(patient_id=p.patient_id, text=p.note)
            pair, _, d = await decide_pair(fz, engine, p.program, record, policy, staged=staged)
            out.decisions[i] = d.decision
            if pair.not_asked:
                out.settled.append(i)
            for r in (pair.inc, pair.exc):
                out.calls += r.usage.calls_paid
                out.completion += r.usage.completion_tokens
                if r.chart_read is not None and not r.chart_read.reused:
                    out.calls += r.chart_read.calls
                    out.completion += r.chart_read.completion_tokens
    finally:
        await fz.aclose()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chart-tokens", type=int, default=8000)
    ap.add_argument("--policy", default="prescreen")
    ap.add_argument("--limit", type=int, default=None, help="only the first N pairs (a quick look)")
    a = ap.parse_args(argv)
    from verdict.core.policy import load_policy
    from verdict.data_gen.formalizer.budget import qwen25_counter
    from verdict.data_gen.scripted_server import ScriptedServer

    qwen = qwen25_counter()
    pairs = load_pairs()[: a.limit]
    policy = load_policy(a.policy)
    taken = {p.program.trial_id for p in pairs}
    quotes = {v["evidence"] for p in pairs for v in p.values.values() if v.get("evidence")}
    docs = filler(taken, a.chart_tokens, qwen.count_text, quotes)
    n_chart = sum(qwen.count_text(d.text) for d in docs)
    print(f"recorded value lines refused by the check (not replayed): {len(REFUSED)}")
    print(
        f"pairs {len(pairs)}; long chart: {len(docs)} other trials' criteria texts "
        f"({n_chart} tokens) + the note"
    )

    def chart(p):
        return chart_of(p, docs)

    srv = ScriptedServer(count_tokens=qwen.count_text).start()
    try:
        runs = [
            asyncio.run(run("1 note v1 exhaustive", pairs, srv, qwen, policy, version="v1", staged=False)),
            asyncio.run(run("2 note v2 exhaustive", pairs, srv, qwen, policy, version="v2", staged=False)),
            asyncio.run(run("3 note v2 staged", pairs, srv, qwen, policy, version="v2", staged=True)),
            asyncio.run(
                run(
                    "4 chart v1 exhaustive whole",
                    pairs,
                    srv,
                    qwen,
                    policy,
                    version="v1",
                    staged=False,
                    chart=chart,
                )
            ),
            asyncio.run(
                run(
                    "5 chart v2 staged read once",
                    pairs,
                    srv,
                    qwen,
                    policy,
                    version="v2",
                    staged=True,
                    chart=chart,
                    reading=True,
                )
            ),
        ]
    finally:
        srv.stop()
    ref, n = runs[0], len(pairs)
    print(f"{'run':34} {'same as 1':>9} {'calls/pair':>10} {'completion/pair':>15} {'settled':>7}")
    for r in runs:
        same = sum(r.decisions[i] == ref.decisions[i] for i in range(n))
        print(f"{r.name:34} {same:>9} {r.calls / n:>10.1f} {r.completion / n:>15.1f} {len(r.settled):>7}")
    exhaustive = runs[1]
    for r in (runs[2], runs[4]):
        bad = [i for i in r.settled if r.decisions[i] != exhaustive.decisions[i]]
        print(f"{r.name}: first stage settled {len(r.settled)} pairs, staged != exhaustive: {len(bad)}")
    print(
        f"completion-tokens: pairs={n} v1_per_pair={ref.completion / n:.0f} "
        f"v2_per_pair={runs[2].completion / n:.0f}"
    )
    same = sum(runs[4].decisions[i] == ref.decisions[i] for i in range(n))
    print(
        f"chart-agreement: pairs={n} same_decisions={same} "
        f"completion_tokens_before={runs[3].completion / n:.0f} "
        f"completion_tokens_after={runs[4].completion / n:.0f}"
    )


if __name__ == "__main__":
    main()
