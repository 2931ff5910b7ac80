"""The 76 reference pairs, single note and in a long chart: same decisions, and completion tokens
before (v1 dense answers, exhaustive mining, the chart mined whole) and after (v2 sparse answers,
staged mining, the chart read once).

    .venv/bin/python benchmarks/chart_agreement.py [--chart-tokens 8000] [--policy prescreen]
    .venv/bin/python benchmarks/chart_agreement.py --write-script FILE   # the bench stage's scripted server

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


@dataclass
class Run:
    name: str
    decisions: dict[int, str] = field(default_factory=dict)
    calls: int = 0
    completion: int = 0
    settled: list[int] = field(default_factory=list)


def load_pairs() -> list:
    """The reference files as recorded pairs (`verdict.bench.long_charts`)."""
    from verdict.bench.long_charts import load_recorded_pairs

    notes = {}
    for line in (SHARED / "benchmarks" / "patients_sigir.jsonl").read_text().splitlines():
        row = json.loads(line)
        notes[row["_id"]] = row["text"]
    return load_recorded_pairs(SHARED / "reference" / "v6", notes)


async def run(name, pairs, srv, qwen, policy, *, version, staged, chart=None, reading=False) -> Run:
    from verdict.bench.long_charts import replay_script
    from verdict.core.engine import Engine
    from verdict.data_gen.formalizer import ChartReading, EndpointConfig, Formalizer, PatientDoc, decide_pair

    teacher = EndpointConfig(
        name="scripted",
        base_url=srv.url,
        model="recorded",
        timeout_s=30,
        max_retries=0,
        limits="paper",  # the students' limits: 4,096-token calls, 1,536 new tokens per miner call
    )
    quotes: dict[str, list[str]] = {}
    for p in pairs:
        quotes.setdefault(p.patient_id, []).extend(p.quotes())
    engine, out = Engine(), Run(name)
    prompts = {"miner_inclusion": version, "miner_exclusion": version}
    fz = Formalizer(teacher, prompts=prompts, reading=ChartReading(enabled=reading), engine=engine)
    try:
        for i, p in enumerate(pairs):
            srv.set_script(replay_script(p.values, quotes[p.patient_id], sparse=version != "v1"))
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
    ap.add_argument(
        "--write-script",
        metavar="FILE",
        help="write the scripted server's script for every reference pair (the bench's "
        "chart-reading-scripted config) to FILE and stop",
    )
    a = ap.parse_args(argv)
    from verdict.bench.long_charts import chart_of, filler_documents, reference_script
    from verdict.core.policy import load_policy
    from verdict.data_gen.formalizer import qwen25_counter
    from verdict.data_gen.scripted_server import ScriptedServer

    pairs = load_pairs()[: a.limit]
    if a.write_script:
        Path(a.write_script).write_text(reference_script(pairs).model_dump_json(exclude_defaults=True))
        print(f"wrote {a.write_script}: the scripted reader and miner for {len(pairs)} reference pairs")
        return
    qwen = qwen25_counter()
    policy = load_policy(a.policy)
    taken = {p.program.trial_id for p in pairs}
    quotes = {q for p in pairs for q in p.quotes()}
    docs = filler_documents(
        SHARED / "benchmarks" / "trials.jsonl", taken, a.chart_tokens, qwen.count_text, quotes
    )
    n_chart = sum(qwen.count_text(d.text) for d in docs)
    print(f"recorded value lines refused by the check (not replayed): {sum(len(p.refused) for p in pairs)}")
    print(
        f"pairs {len(pairs)}; long chart: {len(docs)} other trials' criteria texts "
        f"({n_chart} tokens) + the note"
    )

    def chart(p):
        return chart_of(p.patient_id, p.note, docs)

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
