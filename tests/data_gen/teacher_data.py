"""Small synthetic inputs for the teacher-pipeline tests: trials, notes, teacher answers, configs.

Everything is written by hand here (synthetic notes, no real patients); the shared benchmark data
is used only by the tests that say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.protocol import NoteDocument, PatientDoc, StageResult, TrialDoc
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedResponse


def trial_id(i: int) -> str:
    return f"NCT9{i:07d}"


def trial(i: int) -> TrialDoc:
    return TrialDoc(
        trial_id=trial_id(i),
        title=f"Synthetic trial {i}",
        inclusion=f"Adults aged 18 or older\nDiagnosis of condition {i}",
        exclusion="Pregnancy",
    )


def accepted_result(stage: str, **more) -> StageResult:
    """An accepted stage result with placeholder provenance (teacher t, model m, no prompt)."""
    return StageResult(
        stage=stage, status="accepted", teacher="t", model="m", prompt_version="v", messages=[], **more
    )


def age_atom(definition: str = "Age in years.") -> dict:
    """The age atom as a teacher declares it (demographic, in years)."""
    return {
        "name": "age_years",
        "domain": "int",
        "kind": "demographic",
        "unit": "years",
        "definition": definition,
    }


# The inclusion criterion "Adults": age_years >= 18.
ADULTS = {
    "id": "inc1",
    "text": "Adults",
    "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": 18},
}


def program(i: int) -> dict:
    """A valid ParsedTrial answer for trial(i)."""
    return {
        "atoms": [
            {
                "name": "age_years",
                "domain": "int",
                "kind": "demographic",
                "unit": "years",
                "definition": "The patient's age in years.",
                "source_criteria": ["inc1"],
            },
            {
                "name": f"has_condition_{i}",
                "domain": "bool",
                "kind": "diagnosis",
                "definition": f"The patient has a diagnosis of condition {i}.",
                "source_criteria": ["inc2"],
            },
            {
                "name": "is_pregnant",
                "domain": "bool",
                "kind": "diagnosis",
                "definition": "The patient is currently pregnant.",
                "time_scope": {"kind": "current"},
                "source_criteria": ["exc1"],
            },
        ],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [
                    {
                        "id": "inc1",
                        "text": "Adults aged 18 or older",
                        "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": 18},
                    },
                    {"id": "inc2", "text": f"Diagnosis of condition {i}", "formula": f"has_condition_{i}"},
                ],
                "exclusion": [{"id": "exc1", "text": "Pregnancy", "formula": "is_pregnant"}],
            }
        ],
    }


def bad_program(i: int) -> dict:
    """Uses an atom it does not declare."""
    p = program(i)
    p["cohorts"][0]["exclusion"][0]["formula"] = "is_pregnant_now"
    return p


NOTES = [
    "A {age}-year-old woman presents with fatigue and a  history of condition {i}.\nShe is postmenopausal. "
    "Her sister was treated for asthma in {year}.",
    "A {age}-year-old man with chest pain radiating to the left arm since this morning. Known condition {i}; "
    "he denies smoking. Blood pressure {bp}/90.",
    "A {age}-year-old teacher referred for persistent cough over {weeks} weeks. No prior illnesses. "
    "Lives alone near the river in district {i}.",
]


def patient(j: int) -> PatientDoc:
    text = NOTES[j % len(NOTES)].format(age=30 + 7 * j, i=j, year=1990 + j, bp=120 + j, weeks=2 + j)
    return PatientDoc(patient_id=f"synth-{j}", text=text, data_class="synthetic")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_inputs(
    tmp: Path, n_trials: int, n_patients: int, pairs: list[tuple[int, int]] | None = None
) -> dict:
    """trials.jsonl, patients.jsonl (and pairs.jsonl) in the benchmarks layout."""
    trials = write_jsonl(
        tmp / "trials.jsonl",
        [
            {
                "nct_id": t.trial_id,
                "title": t.title,
                "inclusion": t.inclusion,
                "exclusion": t.exclusion,
                "criteria": None,
            }
            for t in (trial(i) for i in range(n_trials))
        ],
    )
    patients = write_jsonl(
        tmp / "patients.jsonl",
        [
            {"_id": p.patient_id, "text": p.text, "metadata": {}}
            for p in (patient(j) for j in range(n_patients))
        ],
    )
    out = {"trials": trials, "patients": patients}
    if pairs is not None:
        out["pairs"] = write_jsonl(
            tmp / "pairs.jsonl",
            [{"patient_id": f"synth-{j}", "nct_id": trial_id(i), "score": 2} for i, j in pairs],
        )
    return out


CRITERION_IDS = {"inc1": "inc-1", "inc2": "inc-2", "exc1": "exc-1"}  # program(i)'s ids -> the splitter's


def criterion_prompt(side: str, text: str) -> str:
    """The user turn of the per-criterion parser prompt (criterion_parser@v1)."""
    return f"{side.capitalize()} criterion:\n{text}"


def criterion_answers(i: int, bad: bool = False) -> list[tuple[str, dict]]:
    """(user turn, per-criterion answer) for each criterion of trial(i), from program(i) (the
    answer to inc-2, the trial's own criterion, uses an undeclared atom if `bad`)."""
    from verdict.core.program import TrialProgram
    from verdict.data_gen.formalizer import criterion_outputs

    p = TrialProgram(trial_id=trial_id(i), **program(i))
    outs = criterion_outputs(p)
    answers = [
        (criterion_prompt(side, cr.text), outs[cr.id].model_dump(mode="json", exclude_defaults=True))
        for _, side, cr in p.criteria()
    ]
    if bad:  # the trial's own criterion (the others recur in every trial)
        answers[1][1]["formula"] = f"has_condition_{i}_now"
    return answers


def parser_rules(i: int, bad_first: bool = False) -> list[Rule]:
    """Rules answering trial(i)'s criterion calls (a bad first answer to inc-2, fixed by the repair)."""
    rules = []
    good = criterion_answers(i)
    if bad_first:
        for (prompt, fixed), (_, broken) in zip(good, criterion_answers(i, bad=True)):
            if fixed != broken:
                rules.append(
                    Rule(
                        match=Match(contains=[prompt, "rejected by the checker"]),
                        responses=[ScriptedResponse(content=fixed)],
                    )
                )
                rules.append(
                    Rule(match=Match(contains=[prompt]), responses=[ScriptedResponse(content=broken)])
                )
    rules += [
        Rule(match=Match(contains=[prompt]), responses=[ScriptedResponse(content=ans)])
        for prompt, ans in good
    ]
    return rules


def parser_script(n_trials: int, latency: float = 0.0, bad_first: set[int] = frozenset()) -> Script:
    """Valid per-criterion parser answers for trials 0..n-1 (an invalid first answer for those in
    bad_first, fixed by the repair), all-null value-miner answers for everything else. The
    criteria "Adults aged 18 or older" and "Pregnancy" recur in every trial: one call each."""
    rules = []
    for i in range(n_trials):
        rules += parser_rules(i, bad_first=i in bad_first)
    return Script(rules=rules, default=ScriptedResponse(auto="nulls"), default_latency_s=latency)


def teacher_config(url: str, **over) -> EndpointConfig:
    """A teacher on the scripted server at `url`: fast retries, priced (for the cost figures)."""
    cfg = dict(
        name="t",
        base_url=url,
        model="m",
        timeout_s=5,
        backoff_base_s=0.01,
        max_retries=2,
        prices={"input_per_million": 1.0, "output_per_million": 2.0},
    )
    cfg.update(over)
    return EndpointConfig(**cfg)


def write_teacher(tmp: Path, url: str, name: str = "scripted-test", **over) -> Path:
    cfg = {
        "name": name,
        "base_url": url,
        "model": "teacher-model",
        "timeout_s": 10,
        "concurrency": 4,
        "max_retries": 3,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
        "prices": {"input_per_million": 2.0, "output_per_million": 8.0},
    }
    cfg.update(over)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_run(
    tmp: Path, teacher: Path, inputs: dict, name: str = "test-run", data_class: str = "synthetic", **over
) -> Path:
    cfg = {
        "name": name,
        "out_dir": str(tmp / "runs"),
        "cache": str(tmp / "runs" / "cache.sqlite"),
        "teachers": {"parser": str(teacher), "miner": str(teacher)},
        "trials": {"path": str(inputs["trials"])},
        "patients": {"path": str(inputs["patients"]), "data_class": data_class},
    }
    if "pairs" in inputs:
        cfg["pairs"] = {"path": str(inputs["pairs"])}
    cfg.update(over)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def windows(text: str, size: int = 20) -> list[str]:
    """Every `size`-character window of a text (after whitespace normalization), for leak scans."""
    t = " ".join(text.split())
    return [t[i : i + size] for i in range(0, max(1, len(t) - size + 1))]


def leaks(haystack: str, texts: list[str], size: int = 20) -> list[str]:
    hay = " ".join(haystack.split())
    return [w for t in texts for w in windows(t, size) if w in hay]


# ---- a long chart (issue 23: read once) -----------------------------------------------------------
READER_MARK = "You read part of a patient's chart"  # in the reader prompt's system text
COPIED = "Past history: hypertension treated with lisinopril since 2015, well controlled on review."
AGE = "The patient is a 52-year-old woman"
COND_1 = "diagnosed with condition 1 in 2019"
PREG = "pregnancy test was positive"
CHART_VALUES = {  # the value miner's answer for the long chart's atoms, each quoting the chart
    "age_years": {"value": 52, "evidence": AGE},
    "has_condition_1": {"value": True, "evidence": COND_1},
    "is_pregnant": {"value": True, "evidence": PREG},
}


def chart_script(*rules: dict, **values: dict) -> dict:
    """The scripted formalizer for the long chart (a Script as JSON): the reader keeps the age and
    the condition (the pregnancy test, d10, is missed), then `rules`; the value miner answers
    CHART_VALUES and `values` for what it is shown (only_quoted), null for any other atom."""
    reader = {
        "match": {"contains": [READER_MARK]},
        "responses": [{"auto": "excerpts", "auto_excerpts": [AGE, COND_1]}],
    }
    return {
        "rules": [reader, *rules],
        "default": {"auto": "nulls", "only_quoted": True, "auto_values": {**CHART_VALUES, **values}},
    }


def filler(i: int) -> str:
    """A paragraph that states nothing about the patient (distinct per document)."""
    return " ".join(
        f"Room {i}-{j} was cleaned and the schedule for shift {j} of ward {i} was posted." for j in range(12)
    )


def long_chart() -> PatientDoc:
    """12 dated progress notes of distinct filler (well over 2,048 tokens), three facts, and one
    paragraph copied forward from d2 to d11."""
    docs = []
    for i in range(1, 13):
        paras = [filler(i)]
        if i == 3:
            paras.append(f"{AGE} seen for follow up.")
        if i == 7:
            paras.append(f"She was {COND_1} by biopsy.")
        if i == 10:
            paras.append(f"Today a {PREG}.")  # on the chart, but the reader's recording leaves it out
        if i in (2, 11):
            paras.append(COPIED)
        docs.append(
            NoteDocument(id=f"d{i}", text="\n\n".join(paras), date=f"2024-01-{i:02d}", kind="progress_note")
        )
    return PatientDoc(patient_id="p-long", documents=docs)
