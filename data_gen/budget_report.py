"""`verdict teacher budget`: do the formalizer's stage calls fit a student's limits?

Measured with the limits' tokenizer (the real Qwen2.5 vocabulary for `paper`), per stage:

- **reference** (`--recorded`, the paper authors' recorded outputs, default `reference/v6`): the
  stage records a distillation would train on. Parser: one record per criterion, prompt = our
  per-criterion prompt, completion = the recorded program re-expressed as that criterion's output
  JSON. Miner: the calls `plan_miner_calls` makes for each side over the SIGIR note, completion =
  the recorded values of the call's atom chunk in our output format. The last line is computed
  on these records.
- **trials** (`--trials`): the per-criterion parser prompts of every trial (criteria split to fit
  the prompt budget, as the parser does); distinct criteria (the criterion cache's unit) are
  counted once.
- **notes** (`--notes`, with `--note-tokens`): records of 500 / 2,000 / 8,000 tokens made by
  concatenating real patient notes, mined against every reference program (prompts only).

A record fits when its prompt is within `max_length - max_tokens[stage]` and its completion
within `max_tokens[stage]`. Counts only: no patient text is printed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from verdict.data_gen.formalizer import NoteDocument, StudentLimits, TokenCounter, compact, load_limits

SHARED = Path("../shared/data")  # the project's shared corpora, beside the checkout
DEFAULT_TRIALS = [SHARED / "benchmarks" / "trials.jsonl", SHARED / "benchmarks" / "trials_judged0_only.jsonl"]
DEFAULT_NOTES = [
    SHARED / "benchmarks" / "patients_sigir.jsonl",
    SHARED / "benchmarks" / "patients_trec2021.jsonl",
]
DEFAULT_RECORDED = SHARED / "reference" / "v6"
DEFAULT_RECORDED_NOTES = SHARED / "benchmarks" / "patients_sigir.jsonl"
NOTE_TOKENS = (500, 2000, 8000)
MINER_STAGES = ("miner_inclusion", "miner_exclusion")


@dataclass
class StageRecord:
    """One stage call: its prompt and (where measured) completion tokens. prompt None: the call
    could not be planned within the limits at all."""

    corpus: str
    stage: str
    prompt: int | None
    completion: int | None = None
    label: str = ""  # which call (file / trial and criterion id; never patient text)

    def fits(self, limits: StudentLimits) -> bool:
        if self.prompt is None or self.prompt > limits.prompt_budget(self.stage):
            return False
        return self.completion is None or self.completion <= limits.stage_tokens(self.stage)


@dataclass
class Dist:
    n: int
    median: float
    p95: float
    max: int

    @staticmethod
    def of(values: list[int]) -> Dist | None:
        if not values:
            return None
        v = sorted(values)
        return Dist(len(v), _quantile(v, 0.5), _quantile(v, 0.95), v[-1])


def _quantile(v: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(v) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class BudgetReport:
    limits: StudentLimits
    counter: str
    records: list[StageRecord] = field(default_factory=list)
    criteria: int = 0  # trials corpus: criteria (parser calls without a cache)
    distinct_criteria: int = 0  # ... and distinct (side, text): the calls a criterion cache makes
    trials: int = 0
    reference_files: int = 0
    recorded_via_trial: int = 0  # reference files whose parser records use the trial's own criteria text
    problems: list[str] = field(default_factory=list)

    def of(self, corpus: str, stage: str | None = None, prefix: bool = False) -> list[StageRecord]:
        def stage_ok(s: str) -> bool:
            return stage is None or (s.startswith(stage) if prefix else s == stage)

        return [r for r in self.records if r.corpus == corpus and stage_ok(r.stage)]

    def fit(self, records: list[StageRecord]) -> float:
        return sum(r.fits(self.limits) for r in records) / len(records) if records else 1.0

    def summary_line(self) -> str:
        ref = self.of("reference")
        parser, miner = self.of("reference", "parser"), self.of("reference", "miner", prefix=True)
        prompts = [r.prompt for r in ref if r.prompt is not None]
        comps = [r.completion for r in ref if r.completion is not None]
        return (
            f"budget: records={len(ref)} fit={self.fit(ref):.3f} parser_fit={self.fit(parser):.3f} "
            f"miner_fit={self.fit(miner):.3f} max_prompt={max(prompts, default=0)} "
            f"max_completion={max(comps, default=0)} max_length={self.limits.max_length} "
            f"new_tokens={self.limits.max_new_tokens}"
        )


# ---- the corpora -----------------------------------------------------------------------------------
def _trials_by_id(paths: list[Path]) -> dict:
    from .sources import load_trials

    out: dict = {}
    for p in paths:
        for t in load_trials(p).items:
            out.setdefault(t.trial_id, t)
    return out


def measure_reference(
    report: BudgetReport,
    counter: TokenCounter,
    reference_dir: Path,
    notes_path: Path,
    programs: list | None = None,
    trial_paths: list[Path] = (),
) -> None:
    """Per-criterion parser records and planned miner calls of the recorded outputs."""
    from verdict.core.errors import VerdictError
    from verdict.core.reference import load_reference
    from verdict.data_gen.formalizer import MinerBudgetError, plan_miner_calls

    from .recorded import fit_to_grammar, recorded_answer
    from .sources import load_patients

    lim = report.limits
    files = sorted(Path(reference_dir).glob("*/*__full.json"))
    if not files:
        report.problems.append(f"no reference files (<patient>/<trial>__full.json) under {reference_dir}")
        return
    notes = load_patients(notes_path, data_class="public").by_id("patient_id")
    trials = _trials_by_id(trial_paths)
    for f in files:
        where = f"{f.parent.name}/{f.name}"
        report.reference_files += 1
        try:
            case = fit_to_grammar(load_reference(f))  # the records `import-recorded` writes
        except VerdictError as e:
            report.problems.append(f"{where}: {e.summary}")
            continue
        if programs is not None:
            programs.append(case.program)
        m = re.match(r"NCT\d+", f.name)
        trial = trials.get(m.group(0)) if m else None
        if trial is not None:  # the records `import-recorded` writes: the trial's own criteria
            report.recorded_via_trial += 1
            rows = recorded_parser_records(case.program, trial, counter)
        else:  # no criteria text for the trial: the program's criteria, re-expressed one by one
            rows = parser_records(case.program, counter)
        for stage, prompt, completion, item in rows:
            report.records.append(StageRecord("reference", stage, prompt, completion, f"{where} {item}"))
        note = notes.get(f.parent.name)
        if note is None:
            report.problems.append(f"{where}: no note for patient '{f.parent.name}'")
            continue
        for side in ("inclusion", "exclusion"):
            stage = f"miner_{side}"
            try:
                calls = plan_miner_calls(
                    case.program,
                    [NoteDocument(id="note", text=note.text)],
                    side,
                    count_messages=counter.count_messages,
                    count_text=counter.count_text,
                    prompt_budget=lim.prompt_budget(stage),
                    completion_budget=lim.stage_tokens(stage),
                )
            except MinerBudgetError as e:
                report.records.append(StageRecord("reference", stage, None))
                report.problems.append(f"{where} {side}: {e.summary}")
                continue
            for call in calls:
                answer = recorded_answer(case, side, call.atoms, "\n".join(call.texts))
                report.records.append(
                    StageRecord(
                        "reference",
                        stage,
                        call.prompt_tokens,
                        counter.count_text(answer),
                        f"{where} {side} {call.call_id}",
                    )
                )


def recorded_parser_records(program, trial, counter: TokenCounter) -> list[tuple[str, int, int | None, str]]:
    """(stage, prompt, completion, criterion id) of the per-criterion records the recorded import makes
    (`verdict.data_gen.recorded.recorded_parser_result`); a rejected record has no completion."""
    from .recorded import recorded_parser_result

    res = recorded_parser_result(program, trial)
    return [
        (
            "parser",
            counter.count_messages(c.messages),
            counter.count_text(c.output_json) if c.output_json is not None else None,
            c.item or "",
        )
        for c in res.calls
    ]


def parser_records(program, counter: TokenCounter) -> list[tuple[str, int, int, str]]:
    """(stage, prompt tokens, completion tokens, criterion id) of each criterion of a program: our
    prompt for the criterion text, and the program re-expressed as that criterion's output."""
    from verdict.data_gen.formalizer import CriterionText, criterion_messages, criterion_outputs

    sides = {cr.id: side for _, side, cr in program.criteria()}
    texts = {cr.id: cr.text or cr.id for _, _, cr in program.criteria()}
    out = []
    for cid, parsed in criterion_outputs(program).items():
        target = compact(parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True))
        msgs = criterion_messages(CriterionText(id=cid, side=sides[cid], text=texts[cid]))
        out.append(("parser", counter.count_messages(msgs), counter.count_text(target), cid))
    return out


def measure_trials(report: BudgetReport, counter: TokenCounter, trial_paths: list[Path]) -> None:
    """Per-criterion parser prompts of every trial, as the parser splits them (each distinct
    criterion counted once: the criterion cache answers repeats)."""
    from verdict.data_gen.formalizer import CriterionText, criterion_messages, split_trial

    from .sources import load_trials

    budget = report.limits.prompt_budget("parser")
    tokens: dict[tuple[str, str], int] = {}

    def count(c: CriterionText) -> int:
        key = (c.side, c.text)
        if key not in tokens:
            tokens[key] = counter.count_messages(criterion_messages(c))
        return tokens[key]

    seen: set[tuple[str, str]] = set()
    ids: set[str] = set()
    for path in trial_paths:
        loaded = load_trials(path)
        report.problems += loaded.problems
        for trial in loaded.items:
            if trial.trial_id in ids:  # the same trial in two files is parsed once
                continue
            ids.add(trial.trial_id)
            for c in split_trial(trial, lambda c: count(c) <= budget).criteria:
                report.criteria += 1
                key = (c.side, c.text)
                if key in seen:
                    continue
                seen.add(key)
                report.records.append(StageRecord("trials", "parser", count(c)))
    report.trials = len(ids)
    report.distinct_criteria = len(seen)


def synthetic_notes(texts: list[str], counter, sizes: tuple[int, ...]) -> dict[int, str]:
    """Records of (about) each size in tokens: real notes concatenated, cut at a token boundary."""
    out = {}
    for size in sizes:
        ids: list[int] = []
        i = 0
        while len(ids) < size and texts:
            ids += counter.encode(texts[i % len(texts)] + "\n\n")
            i += 1
        out[size] = counter.decode(ids[:size])
    return out


def measure_notes(
    report: BudgetReport,
    counter,
    notes_paths: list[Path],
    programs: list,
    sizes: tuple[int, ...] = NOTE_TOKENS,
) -> None:
    """Planned miner calls for long records, against every reference program."""
    from verdict.data_gen.formalizer import MinerBudgetError, plan_miner_calls

    from .sources import load_patients

    texts = []
    for p in notes_paths:
        texts += [d.text for d in load_patients(p, data_class="public").items]
    if not texts or not programs:
        return
    lim = report.limits
    for size, text in synthetic_notes(texts, counter, sizes).items():
        docs = [NoteDocument(id="note", text=text)]
        for program in programs:
            for stage in MINER_STAGES:
                try:
                    calls = plan_miner_calls(
                        program,
                        docs,
                        stage.removeprefix("miner_"),
                        count_messages=counter.count_messages,
                        count_text=counter.count_text,
                        prompt_budget=lim.prompt_budget(stage),
                        completion_budget=lim.stage_tokens(stage),
                    )
                except MinerBudgetError:
                    report.records.append(StageRecord(f"notes-{size}", stage, None))
                    continue
                report.records += [StageRecord(f"notes-{size}", stage, c.prompt_tokens) for c in calls]


def budget_report(
    trials: list[Path] | None = None,
    notes: list[Path] | None = None,
    recorded: Path | None = None,
    recorded_notes: Path | None = None,
    limits: str = "paper",
    note_tokens: tuple[int, ...] = NOTE_TOKENS,
) -> BudgetReport:
    lim = load_limits(limits)
    counter = lim.counter()
    report = BudgetReport(limits=lim, counter=counter.name)
    programs: list = []
    measure_reference(
        report,
        counter,
        recorded or DEFAULT_RECORDED,
        recorded_notes or DEFAULT_RECORDED_NOTES,
        programs,
        trials or DEFAULT_TRIALS,
    )
    if trials != []:
        measure_trials(report, counter, trials or DEFAULT_TRIALS)
    if notes != [] and note_tokens and hasattr(counter, "encode"):
        measure_notes(report, counter, notes or DEFAULT_NOTES, programs, note_tokens)
    return report


# ---- printing ----------------------------------------------------------------------------------------
def _cell(d: Dist | None) -> str:
    return "-" if d is None else f"{d.median:.0f} / {d.p95:.0f} / {d.max}"


def format_report(report: BudgetReport) -> str:
    lim = report.limits
    lines = [
        f"limits '{lim.name}': max_length={lim.max_length} max_new_tokens={lim.max_new_tokens} "
        + " ".join(f"{s}={lim.stage_tokens(s)}" for s in ("parser", *MINER_STAGES))
        + f" tokenizer={report.counter}",
        "",
        "| corpus | stage | calls | prompt tokens (median / p95 / max) | prompt budget "
        "| completion tokens (median / p95 / max) | max_tokens | fit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    corpora = list(dict.fromkeys(r.corpus for r in report.records))
    for corpus in corpora:
        for stage in ("parser", *MINER_STAGES):
            recs = report.of(corpus, stage)
            if not recs:
                continue
            prompts = Dist.of([r.prompt for r in recs if r.prompt is not None])
            comps = Dist.of([r.completion for r in recs if r.completion is not None])
            unplanned = sum(r.prompt is None for r in recs)
            calls = f"{len(recs)}" + (f" ({unplanned} unplannable)" if unplanned else "")
            lines.append(
                f"| {corpus} | {stage} | {calls} | {_cell(prompts)} | {lim.prompt_budget(stage)} "
                f"| {_cell(comps)} | {lim.stage_tokens(stage)} | {report.fit(recs):.3f} |"
            )
    ref_files = report.reference_files
    if ref_files:
        lines += [
            "",
            f"reference: {ref_files} recorded files; parser records of {report.recorded_via_trial} "
            "from the trial's own criteria (as `import-recorded` writes them), of the others from the "
            "recorded program's criteria re-expressed one by one",
        ]
    if report.trials:
        saved = 1 - report.distinct_criteria / report.criteria if report.criteria else 0.0
        lines += [
            "",
            f"trials: {report.trials} trials, {report.criteria} criteria, {report.distinct_criteria} "
            f"distinct (the criterion cache saves {saved:.1%} of parser calls); prompts fit "
            f"{report.fit(report.of('trials')):.3f}",
        ]
    over = [r for r in report.of("reference") if not r.fits(lim)]
    if over:
        lines += ["", f"reference records over the limits ({len(over)}):"]
        lines += [f"  - {r.stage} {r.label}: prompt {r.prompt}, completion {r.completion}" for r in over[:20]]
        if len(over) > 20:
            lines.append(f"  ... and {len(over) - 20} more")
    if report.problems:
        lines += ["", f"{len(report.problems)} problems:"] + [f"  - {p}" for p in report.problems[:20]]
        if len(report.problems) > 20:
            lines.append(f"  ... and {len(report.problems) - 20} more")
    lines += ["", report.summary_line()]
    return "\n".join(lines)
