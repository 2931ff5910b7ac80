"""A small hand-checkable benchmark scenario (synthetic, no patient data).

Trials and notes are the recorded teacher outputs the tiny vLLM students memorize
(`examples/demo/teacher_records.json`: 2 trials x 3 patients), plus a third trial whose
parser output stays invalid after the repair. The scripted server answers as that teacher
(every call: 1000 prompt + 100 completion tokens, $2/$8 per million = $0.0028), and as a
direct matcher with fixed verdicts. Under the prescreen policy the core decides:

    pair                 label        Verdict (teacher)   LlmMatch (scripted)
    P1__NCT-DM-01        eligible     eligible            eligible
    P2__NCT-DM-01        ineligible   ineligible          ineligible
    P3__NCT-DM-01        ineligible   eligible (T2D open) ineligible
    P1__NCT-CKD-02       eligible     eligible            ineligible
    P2__NCT-CKD-02       ineligible   eligible (open)     ineligible
    P3__NCT-CKD-02       ineligible   ineligible          ineligible
    P1__NCT-BAD-03       eligible     failed (parser)     eligible

so Verdict: TP 2, FP 2, FN 1, TN 2 (F1 4/7, accuracy 4/7); LlmMatch: TP 2, FP 0, FN 1, TN 4
(F1 0.8, accuracy 6/7). One value-miner answer (P2 x CKD, inclusion) is cut off at the token
limit first and repaired.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from verdict.data_gen.formalizer import criterion_outputs, side_atoms
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedResponse

from tests.fixtures.vllm import load_teacher_records, teacher_programs, teacher_values

PARSER_MARK = "ONE eligibility criterion"  # in the (per-criterion) trial parser's system prompt
MATCH_MARK = "clinical research coordinator"  # in the direct matcher's system prompt
REPAIR_MARK = "rejected by the checker"
TOKENS = {"prompt_tokens": 1000, "completion_tokens": 100}
CALL_USD = (1000 * 2.0 + 100 * 8.0) / 1e6

LABELS = {
    ("P1", "NCT-DM-01"): "eligible",
    ("P2", "NCT-DM-01"): "ineligible",
    ("P3", "NCT-DM-01"): "ineligible",
    ("P1", "NCT-CKD-02"): "eligible",
    ("P2", "NCT-CKD-02"): "ineligible",
    ("P3", "NCT-CKD-02"): "ineligible",
    ("P1", "NCT-BAD-03"): "eligible",
}
VERDICT = {
    ("P1", "NCT-DM-01"): "eligible",
    ("P2", "NCT-DM-01"): "ineligible",
    ("P3", "NCT-DM-01"): "eligible",
    ("P1", "NCT-CKD-02"): "eligible",
    ("P2", "NCT-CKD-02"): "eligible",
    ("P3", "NCT-CKD-02"): "ineligible",
}
LLM_MATCH = {
    ("P1", "NCT-DM-01"): "eligible",
    ("P2", "NCT-DM-01"): "ineligible",
    ("P3", "NCT-DM-01"): "ineligible",
    ("P1", "NCT-CKD-02"): "ineligible",
    ("P2", "NCT-CKD-02"): "ineligible",
    ("P3", "NCT-CKD-02"): "ineligible",
    ("P1", "NCT-BAD-03"): "eligible",
}
# the direct matcher's stated scores (prompt v2), by which the ranking orders its trials
LLM_SCORE = {
    ("P1", "NCT-DM-01"): 90,
    ("P1", "NCT-CKD-02"): 20,
    ("P1", "NCT-BAD-03"): 60,
    ("P2", "NCT-DM-01"): 10,
    ("P2", "NCT-CKD-02"): 30,
    ("P3", "NCT-DM-01"): 40,
    ("P3", "NCT-CKD-02"): 5,
}
BAD_TRIAL = {
    "trial_id": "NCT-BAD-03",
    "title": "Anemia study",
    "inclusion": "Hemoglobin below 10 g/dL.",
    "exclusion": "Active bleeding.",
}
BAD_PROGRAM = {  # uses an atom it never declares: rejected, and again after the repair
    "atoms": [
        {
            "name": "hemoglobin_g_dl",
            "domain": "real",
            "kind": "lab_value",
            "unit": "g/dL",
            "definition": "Hemoglobin in g/dL.",
            "source_criteria": ["inc1"],
        }
    ],
    "cohorts": [
        {
            "id": "main",
            "inclusion": [
                {
                    "id": "inc1",
                    "text": "Hemoglobin below 10 g/dL",
                    "formula": {"op": "cmp", "lhs": "hemoglobin_g_dl", "rel": "lt", "rhs": 10},
                }
            ],
            "exclusion": [{"id": "exc1", "text": "Active bleeding", "formula": "active_bleeding"}],
        }
    ],
}
MALFORMED_ROWS = [
    '{"patient_id": "P1", "trial_id": "NCT-DM-01", "label": "maybe"}',
    '{"patient_id": "P2", "label": "eligible"}',
    "{not json",
]


def ok(content, **kw) -> ScriptedResponse:
    return ScriptedResponse(content=content, **TOKENS, **kw)


def records() -> dict:
    return load_teacher_records()


def script(latency: float = 0.0) -> Script:
    recs = records()
    programs = teacher_programs(recs)
    rules: list[Rule] = []
    # the parser answers per criterion (criterion_parser@v1): the teacher program's formalization
    # of each; the bad trial's criteria declare no atoms, before and after the repair
    for t in recs["trials"]:
        outputs = criterion_outputs(programs[t["trial_id"]])
        for _, side, cr in programs[t["trial_id"]].criteria():
            answer = outputs[cr.id].model_dump(mode="json", exclude_defaults=True)
            rules.append(
                Rule(
                    match=Match(contains=[PARSER_MARK, f"{side.capitalize()} criterion:\n{cr.text}"]),
                    responses=[ok(answer, latency_s=latency)],
                )
            )
    for side, formula in (
        ("inclusion", BAD_PROGRAM["cohorts"][0]["inclusion"][0]["formula"]),
        ("exclusion", "active_bleeding"),
    ):
        text = BAD_TRIAL[side]
        rules.append(
            Rule(
                match=Match(contains=[PARSER_MARK, f"{side.capitalize()} criterion:\n{text}"]),
                responses=[ok({"in_scope": True, "atoms": [], "formula": formula}, latency_s=latency)],
            )
        )
    for p in recs["patients"]:
        note_start = p["note"][:30]
        for tid, program in programs.items():
            for side in ("inclusion", "exclusion"):
                names = side_atoms(program, side)
                if not names:
                    continue
                values = [
                    {"atom": v.atom, "value": v.value, "evidence": v.evidence}
                    for v in teacher_values(recs, program, p, side)
                ]
                mark = [note_start, f"Atoms ({side} side)"] + [f'"name": "{n}"' for n in names]
                answer = ok({"values": values}, latency_s=latency)
                if p["patient_id"] == "P2" and tid == "NCT-CKD-02" and side == "inclusion":
                    rules.append(Rule(match=Match(contains=mark + [REPAIR_MARK]), responses=[answer]))
                    rules.append(
                        Rule(
                            match=Match(contains=mark),
                            responses=[ok({"values": values}, fault="truncated", latency_s=latency)],
                        )
                    )
                else:
                    rules.append(Rule(match=Match(contains=mark), responses=[answer]))
    for (pid, tid), verdict in LLM_MATCH.items():
        note = next(p["note"] for p in recs["patients"] if p["patient_id"] == pid)
        answer = {
            "criteria": [
                {
                    "criterion": "all criteria",
                    "side": "inclusion",
                    "status": "met" if verdict == "eligible" else "not_met",
                    "justification": "scripted",
                }
            ],
            "verdict": verdict,
            "rationale": f"scripted {verdict}",
            "score": LLM_SCORE[(pid, tid)],
        }
        rules.append(
            Rule(
                match=Match(contains=[MATCH_MARK, note[:30], f"Trial {tid}:"]),
                responses=[ok(answer, latency_s=latency)],
            )
        )
    return Script(rules=rules)


def write_dataset(root: Path, malformed: bool = True, labels: dict | None = None) -> dict[str, Path]:
    recs = records()
    root.mkdir(parents=True, exist_ok=True)
    trials = root / "trials.jsonl"
    rows = [
        {
            "nct_id": t["trial_id"],
            "title": t["title"],
            "inclusion": t["inclusion"],
            "exclusion": t["exclusion"],
        }
        for t in recs["trials"]
    ]
    rows.append(
        {
            "nct_id": BAD_TRIAL["trial_id"],
            "title": BAD_TRIAL["title"],
            "inclusion": BAD_TRIAL["inclusion"],
            "exclusion": BAD_TRIAL["exclusion"],
        }
    )
    trials.write_text("".join(json.dumps(r) + "\n" for r in rows))
    patients = root / "patients.jsonl"
    patients.write_text(
        "".join(
            json.dumps({"_id": p["patient_id"], "text": p["note"], "metadata": {}}) + "\n"
            for p in recs["patients"]
        )
    )
    pairs = root / "pairs.jsonl"
    lines = [
        json.dumps({"patient_id": p, "trial_id": t, "label": lab})
        for (p, t), lab in (labels or LABELS).items()
    ]
    if malformed:
        lines = lines[:3] + MALFORMED_ROWS + lines[3:]
    pairs.write_text("\n".join(lines) + "\n")
    return {"trials": trials, "patients": patients, "pairs": pairs}


def endpoint(url: str, **kw) -> dict:
    return {
        "name": "scripted",
        "base_url": url,
        "model": "scripted-teacher",
        "max_retries": 1,
        "backoff_base_s": 0.05,
        "timeout_s": 20,
        "prices": {"input_per_million": 2.0, "output_per_million": 8.0},
        **kw,
    }


def write_config(
    root: Path,
    url: str,
    *,
    name: str = "scenario",
    backends: list[dict] | None = None,
    repeats: int = 1,
    concurrency: int = 4,
    labels: dict | None = None,
    malformed: bool = True,
    **extra,
) -> Path:
    files = write_dataset(root / "data", malformed=malformed, labels=labels)
    ep = endpoint(url)
    cfg = {
        "name": name,
        "out_dir": str(root / "runs"),
        "cache": str(root / "runs" / "cache.sqlite"),
        "dataset": {
            "kind": "jsonl",
            "pairs": str(files["pairs"]),
            "patients": str(files["patients"]),
            "trials": [str(files["trials"])],
            "data_class": "synthetic",
        },
        "backends": backends
        if backends is not None
        else [
            {"name": "verdict-scripted", "kind": "formalizer", "parser": ep, "miner": ep},
            {"name": "llmmatch-scripted", "kind": "llm_match", "endpoint": ep, "max_tokens": 512},
        ],
        "policy": "prescreen",
        "repeats": repeats,
        "concurrency": concurrency,
        "scoring": {"bootstrap_b": 500, "seed": 0},
        "purpose": "machinery_check",  # a scripted server: the report labels its figures so
        **extra,
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def write_trec_config(root: Path, url: str, grades: dict, name: str = "ranked", **extra) -> Path:
    """The scenario as a `trec2021` dataset with these graded judgments ({(patient, trial): 0|1|2});
    the score-0 pairs are kept for the ranking only (`not_relevant: rank`)."""
    cfg = write_config(root, url, name=name, malformed=False, **extra)
    pairs = root / "data" / "trec_pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"patient_id": p, "nct_id": t, "score": s}) + "\n" for (p, t), s in grades.items())
    )
    return set_dataset(cfg, kind="trec2021", pairs=str(pairs), not_relevant="rank")


def set_dataset(cfg: Path, **fields) -> Path:
    """Set these fields of the written config's `dataset` section (e.g. data_class="private")."""
    data = yaml.safe_load(cfg.read_text())
    data["dataset"].update(fields)
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg
