"""Bounded value mining: calls per side and prompt tokens for long patient records, no model needed.

    .venv/bin/python benchmarks/miner_calls.py [--limits paper] [--sizes 500,2000,8000] [--programs 3]

Notes of about 500 / 2,000 / 8,000 real Qwen2.5 tokens are built by concatenating real SIGIR and TREC
patient texts (`../shared/data/benchmarks/patients_*.jsonl`), each text one document. They are
planned (`verdict.data_gen.formalizer.miner.plan_miner_calls`: atom chunks x passages) against the largest
reference programs (`../shared/data/reference/v6`, by atom count) under a student's limits
(`configs/limits/NAME.yaml`), and every planned prompt is counted with the real tokenizer.

Printed per program x note size x side: atoms, chunks, passages, calls, prompt tokens (median /
max) against the prompt budget, whether every call fits, and the planning time; then one line:
`miner-calls: records=N calls=C fit=F max_prompt=P prompt_budget=B max_tokens=T`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"


def largest_programs(n: int):
    from verdict.core.reference import load_reference

    progs = {}
    for path in sorted((SHARED / "reference" / "v6").glob("*/*__full.json")):
        p = load_reference(path).program
        progs.setdefault(p.trial_id, p)  # one program per trial
    return sorted(progs.values(), key=lambda p: -len(p.atoms))[:n]


def patient_texts() -> list[tuple[str, str]]:
    out = []
    for name in ("patients_sigir.jsonl", "patients_trec2021.jsonl"):
        for line in (SHARED / "benchmarks" / name).read_text().splitlines():
            row = json.loads(line)
            out.append((row["_id"], row["text"]))
    return out


def record_of(size: int, texts, counter):
    """Documents (one real patient text each) adding up to at least `size` tokens."""
    from verdict.data_gen.protocol import NoteDocument

    docs, total = [], 0
    for pid, text in texts:
        if total >= size:
            break
        docs.append(NoteDocument(id=pid, text=text))
        total += counter.count_text(text)
    return docs, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limits", default="paper", help="configs/limits/NAME.yaml (default: paper)")
    ap.add_argument("--sizes", default="500,2000,8000", help="note sizes in real Qwen2.5 tokens")
    ap.add_argument("--programs", type=int, default=3, help="how many of the largest reference programs")
    a = ap.parse_args(argv)

    from verdict.data_gen.formalizer.budget import load_limits, qwen25_counter
    from verdict.data_gen.formalizer.miner import plan_miner_calls, side_atoms

    limits = load_limits(a.limits)
    counter = qwen25_counter()  # the real vocabulary, whatever the limits' tokenizer is
    texts = patient_texts()
    records = [(size, *record_of(size, texts, counter)) for size in (int(x) for x in a.sizes.split(","))]
    n_calls = n_fit = 0
    worst = 0
    print(f"limits {limits.name}: max_length {limits.max_length}, tokenizer {counter.name}")
    print(
        f"{'program':<16}{'note':>6}{'docs':>5} {'side':<10}{'atoms':>6}{'chunks':>7}{'pass.':>6}{'calls':>6}"
        f"{'prompt med':>11}{'max':>6}{'budget':>7}{'fit':>5}{'plan ms':>9}"
    )
    for prog in largest_programs(a.programs):
        for _size, docs, tokens in records:
            for side in ("inclusion", "exclusion"):
                stage = f"miner_{side}"
                budget = limits.prompt_budget(stage)
                t0 = time.perf_counter()
                calls = plan_miner_calls(
                    prog,
                    docs,
                    side,
                    count_messages=counter.count_messages,
                    count_text=counter.count_text,
                    prompt_budget=budget,
                    completion_budget=limits.stage_tokens(stage),
                )
                ms = (time.perf_counter() - t0) * 1000
                prompts = [c.prompt_tokens for c in calls]
                fit = sum(p <= budget for p in prompts)
                n_calls += len(calls)
                n_fit += fit
                worst = max([worst, *prompts])
                chunks = calls[0].chunks if calls else 0
                passages = len({p.id for c in calls for p in c.passages})
                med = statistics.median(prompts) if prompts else 0
                print(
                    f"{prog.trial_id:<16}{tokens:>6}{len(docs):>5} {side:<10}{len(side_atoms(prog, side)):>6}"
                    f"{chunks:>7}{passages:>6}{len(calls):>6}{med:>11.0f}{max(prompts, default=0):>6}"
                    f"{budget:>7}{'yes' if fit == len(calls) else 'NO':>5}{ms:>9.0f}"
                )
    share = n_fit / n_calls if n_calls else 1.0
    stage = "miner_inclusion"
    print(
        f"miner-calls: records={len(records)} calls={n_calls} fit={share:.3f} max_prompt={worst} "
        f"prompt_budget={limits.prompt_budget(stage)} max_tokens={limits.stage_tokens(stage)}"
    )
    return 0 if n_fit == n_calls else 1


if __name__ == "__main__":
    raise SystemExit(main())
