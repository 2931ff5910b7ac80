"""Tiny students for a laptop-class CPU (the on-site demo, CI, benchmarks): a tiny Qwen2 base and two
LoRA adapters trained through `train/` to reproduce recorded teacher outputs exactly.

    records = load_teacher_records(path)              # recorded teacher outputs (JSON, see below)
    base = build_student_base(work / "base")          # < 1 s
    export = write_student_export(records, work / "export")
    adapters = {t: train_student(base, adapter_datasets(export, t), t, work / "runs") for t in TASKS}
    cfg = student_vllm_config(base, adapters, work / "vllm.log")   # -> VLLMServer(cfg).start()

Recorded teacher outputs (`{"trials": [...], "patients": [...]}`): per trial its criteria and the
parser's ParsedTrial; per patient the note and, per atom, `[value, evidence quote]`. The SFT rows are
rendered with data_gen's formalizer prompts, so the students see exactly what the matching service
sends them; targets are the compact JSON the formalizer accepts.

A patient may give a multi-document chart (`documents`: NoteDocument objects) instead of a note: its
rows are those of a chart read once (`FormalizerConfig.reading`, which must read it): the reader
calls, answered with the recorded quotes' excerpts (the value-miner adapter's `reader` task), and the
value miner on the fact sheet they make.
"""

from __future__ import annotations

import json
from pathlib import Path

from verdict.core.patient import MinedValue
from verdict.core.program import ParsedCriterion, load_program
from verdict.core.progress import Progress
from verdict.data_gen.formalizer import (
    PROMPTS_DIR,
    Formalizer,
    NoteDocument,
    PatientDoc,
    chart_tokens,
    compact,
    criterion_outputs,
    miner_target,
    normalize_criterion,
    plan_for,
    quote_in_note,
    recorded_sheet,
    sheet_plan,
    side_atoms,
)
from verdict.data_gen.sft_record import (
    ADAPTER_TASKS,
    TASKS,  # noqa: F401  (re-exported for the demo and tests)
    SftRecord,
    datasets_quietly,
    features,
    write_jsonl,
)

from .api_config import FormalizerConfig
from .trials.protocol import TrialText
from .trials.serving import trial_doc
from .vllm.config import VLLMConfig

# Context for the tiny tokenizer: a per-criterion parser prompt is under 1k tokens with it.
MAX_MODEL_LEN = 4096
STUDENT_MAX_TOKENS = {"parser": 768, "miner_inclusion": 256, "miner_exclusion": 256}
# Memorization recipe, measured on 2 cores: LoRA r 32 on every linear layer, lr 1e-2 with a cosine
# decay (a constant lr plateaus: the value miner then mixes up patients). 120 parser / 100 miner steps
# reproduced 2/2 and 12/12 records; the margin absorbs prompt-wording changes.
TRAIN_STEPS = {"parser": 150, "value_miner": 120}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_teacher_records(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def prompt_corpus() -> str:

    return "\n".join(p.read_text() for p in sorted(PROMPTS_DIR.glob("*.yaml")))


def build_student_base(out: str | Path) -> Path:
    """The tiny student with a tokenizer that also learned the prompt templates' words: prompts come
    out 2-3x shorter than with the default tiny tokenizer, and training is that much cheaper."""
    # heavy optional dependency: verdict.train: torch, transformers, TRL (train extra)
    from verdict.train.tiny import build_tiny_student

    return build_tiny_student(out, vocab_size=2048, extra_corpus=prompt_corpus())


def teacher_programs(records: dict) -> dict:
    """trial id -> the checked TrialProgram the teacher's parser output makes."""

    return {
        t["trial_id"]: load_program({**t["parsed"], "trial_id": t["trial_id"], "title": t["title"]})
        for t in records["trials"]
    }


def teacher_values(program, patient: dict, side: str) -> list:
    """What the teacher's value miner answered for one pass: the side's atoms, in prompt order."""

    out = []
    for name in side_atoms(program, side):
        value, quote = patient["facts"][name]
        out.append(MinedValue(atom=name, value=value, evidence=quote))
    return out


def trial_text(trial: dict):

    return TrialText(
        trial_id=trial["trial_id"],
        title=trial["title"],
        inclusion=trial["inclusion"],
        exclusion=trial["exclusion"],
    )


def sft_rows(records: dict, limits=None) -> dict[str, list[dict]]:
    """The records as SFT rows (the `verdict teacher export` row layout), prompts rendered by the
    same code the service uses (under `limits`, the service's `FormalizerConfig`; default the tiny
    students')."""
    programs = teacher_programs(records)
    meta = {"teacher": "recorded-teacher", "prompt_version": "v1"}
    rows: dict[str, list[dict]] = {"parser": parser_rows(records, programs, meta, limits)}
    rows["value_miner"] = miner_rows(records, programs, meta, limits)
    reader, sheet_miner = chart_rows(records, programs, meta, limits)
    rows["value_miner"] += sheet_miner
    if reader:
        rows["reader"] = reader
    return rows


def parser_rows(records: dict, programs: dict, meta: dict, limits=None) -> list[dict]:
    """One SFT row per parser call the service makes: the trial's criteria split as the service
    splits them (under `limits`, default the tiny students'), each with the teacher program's
    formalization of that criterion (`verdict.data_gen.formalizer.criterion_outputs`) as the target. A
    recurring criterion is one row. A criterion the teacher program does not have is an error."""

    limits = limits or FormalizerConfig(max_tokens=STUDENT_MAX_TOKENS)
    fz = Formalizer(limits.endpoint(limits.parser_model, "http://127.0.0.1:9/v1"))
    out, seen = [], set()
    for t in records["trials"]:
        program = programs[t["trial_id"]]
        outputs = criterion_outputs(program)
        by_text = {normalize_criterion(cr.text, case=True): outputs[cr.id] for _, _, cr in program.criteria()}
        for text, reason in t.get("out_of_scope", {}).items():  # criteria the teacher left out of the program
            by_text[normalize_criterion(text, case=True)] = ParsedCriterion(in_scope=False, reason=reason)
        for c in fz.trial_criteria(trial_doc(trial_text(t))).criteria:
            target = by_text.get(normalize_criterion(c.text, case=True))
            if target is None:
                raise ValueError(
                    f"teacher records: trial {t['trial_id']} criterion {c.id} '{c.text}' has no "
                    "formalization in its program (criterion texts must match the split)"
                )
            msgs = fz.criterion_messages(c)
            if json.dumps(msgs) in seen:
                continue
            seen.add(json.dumps(msgs))
            answer = target.model_dump(mode="json", by_alias=True, exclude_defaults=True)
            out.append(
                SftRecord.of_call(
                    msgs,
                    compact(answer),
                    task="parser",
                    record_id=f"parser:{t['trial_id']}#{c.id}",
                    trial_id=t["trial_id"],
                    stage="parser",
                    **meta,
                ).row()
            )
    return out


def miner_rows(records: dict, programs: dict, meta: dict, limits=None) -> list[dict]:
    """One SFT row per value-miner call the service makes for a patient x trial x side: the same
    plan (atom chunks x passages, `verdict.data_gen.formalizer.mining_plan.plan_for`) under the
    students' limits (`limits`: the service's `FormalizerConfig`; default: the tiny students'
    max_tokens). A chunk's target is the teacher's values for its atoms, an atom null where its
    quote is not in the call's passage. Chart patients (`documents`): `chart_rows`."""
    fz = _miner_formalizer(limits)
    out = []
    for p in (p for p in records["patients"] if "documents" not in p):
        doc = PatientDoc(patient_id=p["patient_id"], text=p["note"])
        for tid, program in programs.items():
            for side in ("inclusion", "exclusion"):
                out += _call_rows(fz, plan_for(fz, program, doc, side), program, p, tid, side, meta)
    return out


def chart_rows(records: dict, programs: dict, meta: dict, limits=None) -> tuple[list[dict], list[dict]]:
    """(reader rows, value-miner rows) of the chart patients (`documents`): each reader call the
    service makes to read the chart once, its target the recorded quotes' excerpts of its passages
    (`verdict.data_gen.formalizer.reader.recorded_sheet`), and each value-miner call on the fact
    sheet those excerpts make, per trial x side. A chart the service would mine whole (at most
    `limits.reading.read_above_tokens`) is an error: its rows would not be the ones it sends."""
    fz = _miner_formalizer(limits)
    reader, mined = [], []
    for p in (p for p in records["patients"] if "documents" in p):
        docs = [NoteDocument.model_validate(d) for d in p["documents"]]
        if fz.reading is None or chart_tokens(fz, docs) <= fz.reading.read_above_tokens:
            raise ValueError(
                f"teacher records: the chart of {p['patient_id']} would be mined whole, not read "
                "(lower reading.read_above_tokens in the limits)"
            )
        cited = [(quote, atom) for atom, (_, quote) in p["facts"].items() if quote]
        sheet = recorded_sheet(fz, docs, cited, teacher=meta["teacher"], model=fz.endpoint.model)
        for res in sheet.results:
            if not res.accepted:
                raise ValueError(f"teacher records: a reading of {p['patient_id']}'s chart fails its check")
            reader.append(
                SftRecord.of_call(
                    res.messages,
                    res.output_json,
                    task="reader",
                    record_id=f"reader:{p['patient_id']}:{res.item}",
                    trial_id="-",
                    patient_id=p["patient_id"],
                    stage="reader",
                    **meta,
                ).row()
            )
        for tid, program in programs.items():
            for side in ("inclusion", "exclusion"):
                mined += _call_rows(fz, sheet_plan(fz, program, sheet, side), program, p, tid, side, meta)
    return reader, mined


def _miner_formalizer(limits=None) -> Formalizer:
    limits = limits or FormalizerConfig(max_tokens=STUDENT_MAX_TOKENS)
    return Formalizer(
        limits.endpoint(limits.value_miner_model, "http://127.0.0.1:9/v1"),
        prompts=limits.prompts,
        reading=limits.reading,
    )


def _call_rows(fz, plan: list, program, patient: dict, tid: str, side: str, meta: dict) -> list[dict]:
    """The rows of one side's planned value-miner calls: the teacher's values for each call's
    atoms, an atom null where its quote is not in the call's text."""
    facts = {v.atom: v for v in teacher_values(program, patient, side)}
    rid = f"miner_{side}:{tid}:{patient['patient_id']}"
    out = []
    for call in plan:
        values = [
            facts[a]
            if facts[a].value is None or any(quote_in_note(facts[a].evidence, t) for t in call.texts)
            else MinedValue(atom=a, value=None)
            for a in call.atoms
        ]
        out.append(
            SftRecord.of_call(
                call.messages,
                miner_target(values, sparse=fz.prompt(f"miner_{side}").sparse),
                task="value_miner",
                record_id=rid + (f":{call.call_id}" if len(plan) > 1 else ""),
                trial_id=tid,
                patient_id=patient["patient_id"],
                stage=f"miner_{side}",
                **meta,
            ).row()
        )
    return out


def write_student_export(records: dict, out: str | Path, limits=None) -> Path:
    """`out/parser` and `out/value_miner` (and `out/reader` with chart patients) in the SFT export
    layout (DatasetDict + split JSONL)."""
    # heavy optional dependency: datasets (teacher/train extra)
    from datasets import Dataset, DatasetDict

    out = Path(out)
    for task, rows in sft_rows(records, limits).items():
        # Every split holds the same records: the students are meant to memorize them.
        splits = {"train": rows, "validation": rows[:2], "test": rows[:2]}
        folder = out / task
        dd = DatasetDict({s: Dataset.from_list(r, features=features()) for s, r in splits.items()})
        with datasets_quietly():
            dd.save_to_disk(str(folder))
        for s, r in splits.items():
            write_jsonl(folder / f"{s}.jsonl", r)
        (folder / "dataset_card.json").write_text(
            json.dumps(
                {
                    "task": task,
                    "teacher": "recorded-teacher",
                    "prompt_version": "v1",
                    "splits": {s: len(r) for s, r in splits.items()},
                },
                indent=2,
            )
        )
        (folder / "README.md").write_text(f"# {task}: recorded teacher outputs for the tiny students\n")
    return out


def adapter_datasets(export: str | Path, task: str) -> list:
    """The export's datasets an adapter trains on (`DatasetSpec`s): its task's, and the value miner's
    reader task where the export has one (`sft_record.ADAPTER_TASKS`)."""
    # heavy optional dependency: verdict.train (train extra)
    from verdict.train.sft_config import DatasetSpec

    folders = [Path(export) / t for t in ADAPTER_TASKS[task]]
    return [DatasetSpec(path=str(f)) for f in folders if f.is_dir()]


def train_student(
    base_model: str | Path,
    dataset: str | Path,
    task: str,
    out: str | Path,
    steps: int | None = None,
    progress: Progress = lambda m: None,
    init_adapter: str | Path | None = None,
) -> Path:
    """One adapter through `train/` (CPU, memorization recipe); returns the adapter folder. `dataset`:
    an export folder, or a list of `DatasetSpec` (weighted mix); `init_adapter`: continue that adapter
    (the site fine-tune of docs/train.md)."""
    # heavy optional dependency: verdict.train: torch, transformers, TRL (train extra)
    from verdict.train.sft_config import DatasetSpec, LoraSpec, TrainConfig
    from verdict.train.sft_trainer import train

    cfg = TrainConfig(
        name=f"tiny-{task}",
        task=task,
        base_model=str(base_model),
        datasets=dataset if isinstance(dataset, list) else [DatasetSpec(path=str(dataset))],
        init_adapter=str(init_adapter) if init_adapter else None,
        output_dir=str(out),
        eval_split=None,
        lr=1e-2,
        lora=LoraSpec(r=32, alpha=64, dropout=0.0, target_modules=LORA_TARGETS),
        lr_scheduler="cosine",
        warmup_ratio=0.0,
        max_steps=steps or TRAIN_STEPS[task],
        bf16=False,
        max_length=MAX_MODEL_LEN,
        batch_size=8,
        grad_accum=1,
        gradient_checkpointing=False,
        device="cpu",
        seed=0,
        logging_steps=10,
        save_steps=1000,
    )
    return train(cfg.resolved(), progress=progress).adapter_dir


def student_vllm_config(
    base_model: str | Path, adapters: dict[str, str | Path], log_file: str | Path | None = None
):

    # float32: the same numbers as the transformers side of `check-adapter` (auto would be bf16).
    return VLLMConfig(
        model=str(base_model),
        adapters={k: str(v) for k, v in adapters.items()},
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        log_file=str(log_file) if log_file else None,
        ready_timeout_s=300,
    )
