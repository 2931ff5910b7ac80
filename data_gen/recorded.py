"""The recorded teacher: the paper authors' recorded formalizer outputs as per-criterion parser
records and value-miner records.

`../shared/data/reference/v6/<patient>/<NCT id>[variant]__full.json` holds, per patient-trial
variant, the program the authors' trial parser wrote and the values their value miner (GPT-4.1
era) read from the SIGIR note. `verdict.core.reference` turns a file into a TrialProgram and a
resolved patient; here each side becomes one value-miner record: our miner prompt for that side's
atoms and the note, with the recorded values as the teacher's answer, checked like any teacher
output (an evidence quote that is not in the note rejects the record). No API is called.

Parser records. The authors' SMT asserts are named `REQk_COMPONENTj_*` (criteria) and
`REQk_AUXILIARYj` (definitions): one REQk per requirement of a side. `requirement_outputs`
re-expresses each requirement as our per-criterion output (its components' formulas joined: `and`
on the inclusion side, where each must hold, `or` on the exclusion side, where each excludes; the
atoms they use; the definitions that belong to them). Alignment with the criterion text (the
trial's criteria in `trials.jsonl`, split by `criteria.py`), per side: when the side has as many
criteria as requirements, REQk is the (k+1)-th criterion ("index"); otherwise each requirement goes
to the criterion whose text shares most of the words of its atom names (at least half of them;
"overlap"), and requirements that land on one criterion are joined. A requirement that aligns with
no criterion, and a criterion no requirement aligns with (the authors leave consent and logistics
out), make no record and are counted in the summary, never dropped silently.

Mapping of values: observed -> the value (or bounds) with its evidence; imputed by the authors'
silence default or unresolved -> null, since our miner reports only what the note establishes and
leaves defaults to the site's policy. Under the sparse prompt (v2, the default) a null is left out
of the target; `--prompt-version v1` writes the dense targets (a line for every atom).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from verdict.core.engine import default_engine
from verdict.core.errors import VerdictError
from verdict.core.formula import atoms_in
from verdict.core.program import ParsedCriterion, TrialProgram
from verdict.core.reference import load_reference
from verdict.data_gen.formalizer import (
    SINGLE_NOTE_ID,
    CriterionText,
    NoteDocument,
    PatientDoc,
    StageResult,
    TrialDoc,
    Usage,
    check_criterion_output,
    check_miner_output,
    compact,
    criterion_messages,
    criterion_outputs,
    miner_messages,
    quote_in_note,
    recorded_reader_result,
    side_atoms,
    split_trial,
    stage_prompt,
)

from .records import RecordStore
from .sources import load_patients, load_trials

TEACHER = "recorded-v6"
MODEL = "gpt-4.1 (recorded by the paper authors)"


@dataclass
class RecordedSummary:
    run_dir: str
    files: int = 0
    accepted: int = 0
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    parser_accepted: int = 0
    parser_rejected: int = 0
    parser_reasons: dict[str, int] = field(default_factory=dict)
    requirements: int = 0
    requirements_unaligned: int = 0
    criteria_without_requirement: int = 0
    alignment: dict[str, int] = field(default_factory=dict)  # method -> sides aligned that way
    no_trial_text: int = 0  # files whose trial is not in the trials file
    reader_accepted: int = 0  # reader records (one per patient note: its recorded quotes as excerpts)
    reader_rejected: int = 0


@dataclass
class Requirement:
    """One recorded requirement (REQk of a side) as our per-criterion parser output."""

    side: str
    req: str  # "REQ3"
    criteria: list[str]  # the program's criterion ids (components)
    output: ParsedCriterion


_REQ = re.compile(r"^(inc|exc)\.(REQ\d+)_")
_STOP = {
    "patient",
    "has",
    "have",
    "is",
    "of",
    "the",
    "a",
    "an",
    "and",
    "or",
    "now",
    "diagnosis",
    "value",
    "any",
    "inthehistory",
    "in",
    "with",
    "to",
    "for",
    "on",
    "by",
    "at",
    "be",
    "not",
    "no",
}


def requirement_outputs(program: TrialProgram) -> list[Requirement]:
    """Each recorded requirement re-expressed as our per-criterion output, in program order."""
    per_criterion = criterion_outputs(program)
    groups: dict[tuple[str, str], list[str]] = {}
    for _, side, cr in program.criteria():
        m = _REQ.match(cr.id)
        key = (side, m.group(2) if m else cr.id)
        if cr.id not in groups.setdefault(key, []):
            groups[key].append(cr.id)
    return [
        Requirement(
            side=side, req=req, criteria=ids, output=join_outputs([per_criterion[i] for i in ids], side)
        )
        for (side, req), ids in groups.items()
    ]


def join_outputs(outputs: list[ParsedCriterion], side: str) -> ParsedCriterion:
    """Several outputs as one criterion's: formulas joined (inclusion: and; exclusion: or)."""
    if len(outputs) == 1:
        return outputs[0]
    atoms, defs, seen = {}, [], set()
    for o in outputs:
        for a in o.atoms:
            atoms.setdefault(a.name, a)
        for d in o.definitions:
            if d.id not in seen:
                seen.add(d.id)
                defs.append(d)
    op = "and" if side == "inclusion" else "or"
    args = [o.formula if isinstance(o.formula, str) else o.formula.model_dump(by_alias=True) for o in outputs]
    labels = sorted({x for o in outputs for x in o.cohorts})
    return ParsedCriterion.model_validate(
        {
            "in_scope": True,
            "atoms": [a.model_dump() for a in atoms.values()],
            "formula": {"op": op, "args": args},
            "definitions": [d.model_dump(by_alias=True) for d in defs],
            "cohorts": labels,
        }
    )


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) > 1 and w not in _STOP}


Aligned = list[tuple[CriterionText, list[Requirement]]]


def align_requirements(
    reqs: list[Requirement], criteria: list[CriterionText]
) -> tuple[Aligned, list[Requirement], list[CriterionText], dict[str, int]]:
    """(aligned criterion -> its requirements, unaligned requirements, criteria without one,
    method counts); see the module docstring for the rule."""
    aligned: dict[str, list[Requirement]] = {}
    unaligned: list[Requirement] = []
    methods: dict[str, int] = {}
    by_id = {c.id: c for c in criteria}
    for side in ("inclusion", "exclusion"):
        rs = [r for r in reqs if r.side == side]
        cs = [c for c in criteria if c.side == side]
        if not rs:
            continue
        if len(rs) == len(cs):
            methods["index"] = methods.get("index", 0) + 1
            for r, c in zip(rs, cs):
                aligned.setdefault(c.id, []).append(r)
            continue
        methods["overlap"] = methods.get("overlap", 0) + 1
        words = {c.id: _words(c.text) for c in cs}
        for r in rs:
            names = atoms_in(r.output.formula) if r.output.formula is not None else set()
            rw = set().union(*(_words(n.replace("@@", " ")) for n in names))
            best = max(cs, key=lambda c: len(rw & words[c.id]), default=None)
            if best is None or not rw or len(rw & words[best.id]) < max(1, len(rw) / 2):
                unaligned.append(r)
                continue
            aligned.setdefault(best.id, []).append(r)
    pairs = [(by_id[cid], rs) for cid, rs in aligned.items()]
    pairs.sort(key=lambda p: criteria.index(p[0]))
    uncovered = [c for c in criteria if c.id not in aligned]
    return pairs, unaligned, uncovered, methods


def recorded_parser_result(
    program: TrialProgram, trial: TrialDoc, prompt_version: str = "v1", out: RecordedSummary | None = None
) -> StageResult:
    """The recorded program as a parser result made of per-criterion calls (one per aligned
    criterion, each checked like a live call); `output` is the recorded program."""
    out = out if out is not None else RecordedSummary(run_dir="")
    reqs = requirement_outputs(program)
    split = split_trial(trial)
    pairs, unaligned, uncovered, methods = align_requirements(reqs, split.criteria)
    out.requirements += len(reqs)
    out.requirements_unaligned += len(unaligned)
    out.criteria_without_requirement += len(uncovered)
    for k, v in methods.items():
        out.alignment[k] = out.alignment.get(k, 0) + v
    calls = []
    for c, rs in pairs:
        answer = compact(
            join_outputs([r.output for r in rs], c.side).model_dump(
                mode="json", by_alias=True, exclude_defaults=True
            )
        )
        check = check_criterion_output(
            answer, "stop", c, max_tokens=0, check_satisfiable=default_engine().check_satisfiable
        )
        calls.append(
            check.result(
                stage="parser",
                teacher=TEACHER,
                model=MODEL,
                prompt_version=f"criterion_parser@{prompt_version}",
                messages=criterion_messages(c, prompt_version),
                item=c.id,
            )
        )
        if check.ok:
            out.parser_accepted += 1
        else:
            out.parser_rejected += 1
            out.parser_reasons[check.reason or "?"] = out.parser_reasons.get(check.reason or "?", 0) + 1
    report = {
        "requirements": len(reqs),
        "aligned": [c.id for c, _ in pairs],
        "unaligned_requirements": [f"{r.side}:{r.req}" for r in unaligned],
        "criteria_without_requirement": [c.id for c in uncovered],
        "alignment": methods,
    }
    return StageResult(
        stage="parser",
        status="accepted",
        teacher=TEACHER,
        model=MODEL,
        prompt_version=f"criterion_parser@{prompt_version}",
        messages=[],
        output=program,
        calls=calls,
        usage=Usage(),
        assembly=report,
    )


_QUOTED = re.compile(r'"([^"]{3,})"|“([^”]{3,})”|‘([^’]{3,})’|(?<![A-Za-z])\'([^\']{3,})\'(?![A-Za-z])')


def recorded_evidence(evidence: str, note: str) -> str:
    """The authors' evidence strings mix quotes with commentary ('"pain started while walking"; no
    pain at rest'). When every quoted part occurs in the note, those parts are the evidence."""
    parts = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(evidence)]
    if parts and all(quote_in_note(p, note) for p in parts) and not quote_in_note(evidence, note):
        return " ... ".join(p.strip() for p in parts)
    return evidence


def grammar_name(name: str) -> str:
    """A recorded name the parser's grammar can write: at most GRAMMAR_MAX_NAME characters, the
    longer ones cut and tagged with a hash of the whole (deterministic, collision-safe)."""
    import hashlib

    from verdict.core.schemas import GRAMMAR_MAX_NAME

    if len(name) <= GRAMMAR_MAX_NAME:
        return name
    return name[: GRAMMAR_MAX_NAME - 9] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]


def fit_to_grammar(case):
    """The case with every atom name longer than the parser's grammar allows renamed (`grammar_name`)
    in its program and its patient, so the records taught from it are ones a student can decode.
    The recorded corpus has 101 such names (up to 188 characters) in 40 of its 76 files."""
    from dataclasses import replace

    from verdict.core.formula import rename, render
    from verdict.core.program import check_program

    mapping = {a.name: grammar_name(a.name) for a in case.program.atoms if grammar_name(a.name) != a.name}
    if not mapping:
        return case
    p = case.program
    cohorts = [
        co.model_copy(
            update={
                side: [
                    cr.model_copy(update={"formula": rename(cr.formula, mapping)}) for cr in getattr(co, side)
                ]
                for side in ("inclusion", "exclusion")
            }
        )
        for co in p.cohorts
    ]
    program = check_program(
        p.model_copy(
            update={
                "atoms": [a.model_copy(update={"name": mapping.get(a.name, a.name)}) for a in p.atoms],
                "definitions": [
                    d.model_copy(
                        update={
                            "formula": rename(d.formula, mapping),  # a rendered text follows
                            "text": render(rename(d.formula, mapping))
                            if d.text == render(d.formula)
                            else d.text,
                        }
                    )
                    for d in p.definitions
                ],
                "cohorts": cohorts,
                "content_hash": None,
            }
        )
    )
    patient = case.patient.model_copy(
        update={
            "program_hash": program.content_hash,
            "resolutions": [
                r.model_copy(update={"atom": mapping.get(r.atom, r.atom)}) for r in case.patient.resolutions
            ],
        }
    )
    conflicts = [
        c.model_copy(
            update={
                k: [mapping.get(a, a) for a in getattr(c, k)] for k in ("atoms", "set_aside") if hasattr(c, k)
            }
        )
        for c in case.conflicts
    ]
    return replace(case, program=program, patient=patient, conflicts=conflicts)


def recorded_answer(case, side: str, names: list[str], note: str, *, sparse: bool = True) -> str:
    """The recorded values of one side, in our value-miner output format (sparse: the null lines
    left out, as the v2 prompt asks)."""
    have = case.patient.by_atom()
    values = []
    for n in names:
        r = have.get(n)
        if r is not None and r.status == "observed":
            v = {"atom": n, "value": r.value, "evidence": recorded_evidence(r.evidence or "", note)}
            if r.bounds is not None:
                v["bounds"] = r.bounds.model_dump(exclude_defaults=True)
            values.append(v)
        elif not sparse:
            values.append({"atom": n, "value": None, "evidence": ""})
    return compact({"values": values})


def import_recorded(
    reference_dir: str | Path,
    patients_path: str | Path,
    out_dir: str | Path = "runs",
    name: str = "recorded-v6",
    prompt_version: str = "v2",
    trials_path: str | Path | list[str | Path] | None = None,
    parser_prompt_version: str = "v1",
) -> RecordedSummary:
    """The recorded outputs under `reference_dir` as checked records in `<out_dir>/<name>`: per
    file a parser record (when the trial's text is known) and a value-miner record per side, per
    patient note a reader record."""
    ref = Path(reference_dir)
    files = sorted(ref.glob("*/*__full.json"))
    if not files:
        raise VerdictError(f"no reference files (<patient>/<trial>__full.json) under {ref}")
    patients = load_patients(patients_path, data_class="public")
    run_dir = Path(out_dir) / name
    store = RecordStore(run_dir / "records.sqlite")
    out = RecordedSummary(run_dir=str(run_dir), problems=list(patients.problems))
    trial_files = (
        [] if trials_path is None else list(trials_path) if isinstance(trials_path, list) else [trials_path]
    )
    run = _RecordedImport(
        store=store,
        out=out,
        notes=patients.by_id("patient_id"),
        trials=_trial_texts(trial_files, out),
        has_trial_files=bool(trial_files),
        prompt_version=prompt_version,
        parser_prompt_version=parser_prompt_version,
    )
    try:
        store.set_meta(
            "config",
            {
                "name": name,
                "recorded": True,
                "reference_dir": str(reference_dir),
                "patients": str(patients_path),
                "trials": [str(x) for x in trial_files],
                "teachers": {"parser": TEACHER, "miner": TEACHER},
            },
        )
        for f in files:
            run.import_file(f)
        run.put_reader_records()
        store.set_meta("status", "complete")
    finally:
        store.close()
    return out


def _trial_texts(trial_files: list[str | Path], out: RecordedSummary) -> dict[str, TrialDoc]:
    """The trials by id; the first file that has a trial gives its text (load problems counted)."""
    trials: dict[str, TrialDoc] = {}
    for tf in trial_files:
        loaded = load_trials(tf)
        out.problems += loaded.problems
        for t in loaded.items:
            trials.setdefault(t.trial_id, t)
    return trials


@dataclass
class _RecordedImport:
    """One import: the store the records go to, the notes and trial texts they are checked
    against, and the summary it counts into."""

    store: RecordStore
    out: RecordedSummary
    notes: dict[str, PatientDoc]
    trials: dict[str, TrialDoc]
    has_trial_files: bool
    prompt_version: str
    parser_prompt_version: str
    # patient -> (first trial, (recorded quote, the atom citing it) of every trial)
    quotes: dict[str, tuple[str, list[tuple[str, str]]]] = field(default_factory=dict)

    def import_file(self, f: Path) -> None:
        """One reference file: its parser record and a value-miner record per side; a file with no
        note or that does not load is a problem in the summary."""

        out = self.out
        out.files += 1
        patient_id, stem = f.parent.name, f.name.split("__")[0]
        m = re.match(r"(NCT\d+)", stem)
        trial_id = m.group(1) if m else stem
        note = self.notes.get(patient_id)
        if note is None:
            out.problems.append(f"{f.parent.name}/{f.name}: no note for patient '{patient_id}'")
            return
        try:
            case = fit_to_grammar(load_reference(f))
        except VerdictError as e:
            out.problems.append(f"{f.parent.name}/{f.name}: {e.summary}")
            return
        self.quotes.setdefault(patient_id, (trial_id, []))[1].extend(
            (r.evidence, r.atom) for r in case.patient.resolutions if r.status == "observed" and r.evidence
        )
        trial = self.trials.get(trial_id)
        if trial is not None:
            parsed = recorded_parser_result(case.program, trial, self.parser_prompt_version, out)
            self.store.put(parsed, trial_id, item=stem)
        elif self.has_trial_files:
            out.no_trial_text += 1
        for side in ("inclusion", "exclusion"):
            self.put_miner_record(case, side, note.text, trial_id, patient_id, stem)

    def put_miner_record(self, case, side: str, note: str, trial_id: str, patient_id: str, stem: str) -> None:
        """The side's recorded values as a value-miner record, checked like a teacher's answer (a
        side without atoms makes none)."""
        names = side_atoms(case.program, side)
        if not names:
            return
        stage = f"miner_{side}"
        sparse = stage_prompt(stage, self.prompt_version).sparse
        answer = recorded_answer(case, side, names, note, sparse=sparse)
        check = check_miner_output(answer, "stop", case.program, names, note, max_tokens=0, sparse=sparse)
        res = check.result(
            stage=stage,
            teacher=TEACHER,
            model=MODEL,
            prompt_version=f"miner_{side}@{self.prompt_version}",
            messages=miner_messages(case.program, note, side, names, self.prompt_version),
        )
        self.store.put(res, trial_id, patient_id, item=stem)
        if check.ok:
            self.out.accepted += 1
        else:
            self.out.rejected += 1
            self.out.reasons[check.reason or "?"] = self.out.reasons.get(check.reason or "?", 0) + 1

    def put_reader_records(self) -> None:
        """The reader's distillation: one record per note, its recorded quotes as the excerpts (its
        split follows the patient's first trial)."""
        for patient_id, (trial_id, said) in self.quotes.items():
            note = self.notes[patient_id]
            doc = NoteDocument(id=SINGLE_NOTE_ID, text=note.text)
            res = recorded_reader_result(doc, said, teacher=TEACHER, model=MODEL)
            self.store.put(res, trial_id, patient_id, item=f"reader-{patient_id}")
            if res.accepted:
                self.out.reader_accepted += 1
            else:
                self.out.reader_rejected += 1


def assembly_figures(reference_dir: str | Path) -> dict:
    """The assembly on the reference corpus: each recorded program re-expressed per requirement
    (`requirement_outputs`) and assembled again; merges, renames and near-duplicates counted."""
    from verdict.data_gen.formalizer import assemble

    f = {
        "files": 0,
        "refused": 0,
        "requirements": 0,
        "atom_declarations": 0,
        "atoms": 0,
        "merged": 0,
        "renamed": 0,
        "near_duplicates": 0,
        "assembled": 0,
    }
    for path in sorted(Path(reference_dir).glob("*/*__full.json")):
        f["files"] += 1
        try:
            program = load_reference(path).program
        except VerdictError:
            f["refused"] += 1
            continue
        n = {"inclusion": 0, "exclusion": 0}
        criteria, outputs = [], {}
        for r in requirement_outputs(program):
            n[r.side] += 1
            c = CriterionText(f"{r.side[:3]}-{n[r.side]}", r.side, r.req)  # type: ignore[arg-type]
            criteria.append(c)
            outputs[c.id] = r.output
        asm = assemble(
            program.trial_id,
            program.title,
            criteria,
            outputs,
            {},
            check_satisfiable=default_engine().check_satisfiable,
        )
        f["requirements"] += len(criteria)
        f["atom_declarations"] += sum(len(o.atoms) for o in outputs.values())
        f["merged"] += len(asm.report["merged"])
        f["renamed"] += len(asm.report["renamed"])
        f["near_duplicates"] += len(asm.report["near_duplicates"])
        if asm.program is not None:
            f["assembled"] += 1
            f["atoms"] += len(asm.program.atoms)
    return f
