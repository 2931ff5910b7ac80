"""Value-miner calls per pair with and without reuse across trials, on the shared TREC 2021 data:
every topic against every trial judged for it.

    .venv/bin/python benchmarks/miner_reuse.py [--topics 74] [--limits paper]

No model is needed. Programs: the service's own criterion splitter (`verdict.data_gen.formalizer.criteria`)
cuts each judged trial into criteria, and each distinct criterion text (after the parser's
normalization) becomes one atom whose definition is that text: what the per-criterion parser and
its criterion cache give for a recurring criterion (the same output, so the same atom). Real parser
outputs also share atoms between criteria worded differently ("age >= 18", "adults"), so the reuse
measured here is a lower bound. Values: the project's scripted formalizer (real HTTP, `auto nulls`)
answers every call; the miner plans its calls with the real Qwen2.5 tokenizer under the student's
limits (`configs/limits/NAME.yaml`), and every call it sends is counted at the server.

Printed: pairs, calls per pair without and with reuse (`data_gen/formalizer/value_reuse.py`), the
share of atoms answered from another trial, how calls per pair fall with the share of a pair's atoms
an earlier trial of the same patient already asked, and one line:
`miner-reuse: topics=N pairs=P calls_per_pair=A reused_calls_per_pair=B saved=S atom_reuse=R`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BENCH = REPO.parent / "shared" / "data" / "benchmarks"


def criterion_program(trial):
    """One bool atom per distinct criterion text (see the module docstring)."""
    from verdict.core.program import load_program
    from verdict.data_gen.formalizer import split_trial

    atoms, cohort = {}, {"id": "main", "inclusion": [], "exclusion": []}
    for c in split_trial(trial).criteria:
        name = "c_" + hashlib.sha256(c.text.lower().encode()).hexdigest()[:12]
        atoms.setdefault(name, {"name": name, "domain": "bool", "kind": "other", "definition": c.text[:2000]})
        cohort[c.side].append({"id": c.id, "text": c.text, "formula": name})
    if not atoms:
        return None
    return load_program({"trial_id": trial.trial_id, "atoms": list(atoms.values()), "cohorts": [cohort]})


def load(topics: int):
    from verdict.data_gen.sources import load_pairs, load_patients, load_trials

    patients = load_patients(BENCH / "patients_trec2021.jsonl", data_class="public").items[:topics]
    pairs = load_pairs(BENCH / "pairs_trec2021.jsonl").items
    trials = {}
    for name in ("trials.jsonl", "trials_judged0_only.jsonl"):  # the first file with a trial gives its text
        for t in load_trials(BENCH / name).items:
            trials.setdefault(t.trial_id, t)
    by_patient = {
        p.patient_id: [x.trial_id for x in pairs if x.patient_id == p.patient_id and x.trial_id in trials]
        for p in patients
    }
    return patients, by_patient, trials


async def mine_all(url, limits, patients, by_patient, programs, reuse: bool) -> dict[str, list[int]]:
    """patient id -> calls made for each of its trials, in trial order."""
    from verdict.data_gen.formalizer import EndpointConfig, Formalizer, ValueReuse

    t = EndpointConfig(
        name="scripted",
        base_url=url,
        model="scripted",
        timeout_s=60,
        max_retries=0,
        max_tokens=limits.max_tokens.model_dump(),
        context_tokens=limits.max_length,
        tokenizer="qwen2.5",
    )
    fz = Formalizer(t, value_reuse=ValueReuse() if reuse else None)
    out: dict[str, list[int]] = {}
    try:
        for p in patients:
            calls = []
            for tid in by_patient[p.patient_id]:
                prog = programs.get(tid)
                if prog is None:
                    continue
                n = 0
                for side in ("inclusion", "exclusion"):
                    res = await fz.mine_values(prog, p, side)
                    n += len(res.calls)
                calls.append(n)
            out[p.patient_id] = calls
    finally:
        await fz.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--topics", type=int, default=74, help="how many TREC 2021 topics (patients), in file order"
    )
    ap.add_argument("--limits", default="paper", help="configs/limits/NAME.yaml (default: paper)")
    a = ap.parse_args(argv)

    from verdict.data_gen.formalizer import load_limits
    from verdict.data_gen.scripted_server import Script, ScriptedResponse, ScriptedServer

    limits = load_limits(a.limits)
    patients, by_patient, trials = load(a.topics)
    needed = {t for ts in by_patient.values() for t in ts}
    programs = {tid: p for tid in sorted(needed) if (p := criterion_program(trials[tid])) is not None}
    runs = {}
    for reuse in (False, True):
        srv = ScriptedServer(Script(default=ScriptedResponse(auto="nulls"))).start()
        try:
            t0 = time.monotonic()
            runs[reuse] = asyncio.run(mine_all(srv.url, limits, patients, by_patient, programs, reuse))
            sent = len(srv.requests)
        finally:
            srv.stop()
        made = sum(sum(v) for v in runs[reuse].values())
        assert made == sent, (made, sent)  # every call the miner made reached the server, and no other
        print(f"{'with' if reuse else 'without'} reuse: {sent} calls in {time.monotonic() - t0:.1f} s")
    pairs = sum(len(v) for v in runs[False].values())
    without, with_ = (sum(sum(v) for v in runs[r].values()) for r in (False, True))
    atoms = sum(len(programs[t].atoms) for ts in by_patient.values() for t in ts if t in programs)
    distinct = sum(
        len({a.name for t in ts if t in programs for a in programs[t].atoms}) for ts in by_patient.values()
    )
    print(f"\n{len(patients)} topics, {pairs} judged pairs with criteria text, {len(programs)} trials")
    print(
        f"calls per pair: {without / pairs:.2f} without reuse, {with_ / pairs:.2f} with reuse "
        f"({1 - with_ / without:.1%} fewer); atoms per pair {atoms / pairs:.1f}, distinct per patient "
        f"{distinct / len(patients):.1f} of {atoms / len(patients):.1f}"
    )
    # How calls fall as trials share atoms: pairs binned by the share of their atoms already mined
    # for the same patient by an earlier trial.
    bins: dict[str, list[tuple[int, int]]] = {}
    for pid, ts in by_patient.items():
        seen: set[str] = set()
        k = 0
        for tid in ts:
            if tid not in programs:
                continue
            names = {a.name for a in programs[tid].atoms}
            share = len(names & seen) / len(names)
            label = (
                "0%"
                if share == 0
                else "100%"
                if share == 1
                else f"{int(share * 4) * 25}-{int(share * 4) * 25 + 25}%"
            )
            bins.setdefault(label, []).append((runs[False][pid][k], runs[True][pid][k]))
            seen |= names
            k += 1
    print("\ncalls per pair by the share of its atoms an earlier trial of the same patient already asked:")
    print(f"{'share':>8} {'pairs':>6} {'without':>8} {'with':>8}")
    for label in ("0%", "0-25%", "25-50%", "50-75%", "75-100%", "100%"):
        rows = bins.get(label, [])
        if rows:
            print(
                f"{label:>8} {len(rows):>6} {sum(r[0] for r in rows) / len(rows):>8.2f} "
                f"{sum(r[1] for r in rows) / len(rows):>8.2f}"
            )
    print(
        f"\nminer-reuse: topics={len(patients)} pairs={pairs} calls_per_pair={without / pairs:.2f} "
        f"reused_calls_per_pair={with_ / pairs:.2f} saved={1 - with_ / without:.3f} "
        f"atom_reuse={1 - distinct / atoms:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
