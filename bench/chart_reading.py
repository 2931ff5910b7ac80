"""Read once vs exhaustive mining on long charts (issue 23's site benchmark, `chart_reading:`).

For every configured value-miner endpoint (a `formalizer` backend: its parser's programs and its
miner; or `miners:` rows: an endpoint on a `recorded` backend's programs) and every pair of the
dataset whose patient has a long chart, the pair is mined twice with the same endpoint, both sides,
unstaged:

- **exhaustive**: every passage of the chart with every atom chunk (`Formalizer` without reading);
- **read once**: the chart read once into a fact sheet, each trial's atoms mined against the sheet,
  a large sheet routed to each atom chunk (`ChartReading`, `data_gen/formalizer/reader.py`,
  `routing.py`); the reading is shared by the patient's pairs.

Per atom of the program, read once against exhaustive: the same value, both null, a **miss**
(read once null where exhaustive found a value), added (read once found a value where exhaustive
found none), or different values. Per pair: the same decision, the same tier (the screen's order),
under the run's policy. Costs of both: calls, prompt and completion tokens per pair (calls answered
from the call cache count as the calls they were: the figures describe the method, not this run's
bill), the reading's one-time cost per patient and its amortization over the patient's trials in
the run and over `amortize_over` trials.

Charts (`charts.source`): the dataset's patients (`dataset`: multi-document JSONL or `verdict fhir
load --out` records), a FHIR source (`fhir`: a Bundle file, a folder of Bundles, or a Bulk NDJSON
folder), or, for machinery checks, each dataset note among other trials' criteria texts (`filler`,
`bench/long_charts.py`). Each comparison is appended to `chart_reading.jsonl` as it finishes (ids,
atom names, categories and counts: no chart text), so a stopped run resumes and a rerun pays nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field
from verdict.core.configs import StrictModel
from verdict.core.jsonl_store import JsonlStore
from verdict.data_gen.formalizer import ChartReading

from .backends.endpoints import EndpointPlacement, EndpointRef, resolve_endpoint
from .markdown import rate_text, section, side_by_side, table
from .pending import Pending
from .protocol import BenchError, DecisionValue

CHART_FILE = "chart_reading.jsonl"
Category = Literal["same", "both_null", "miss", "added", "different"]
CATEGORIES: tuple[str, ...] = ("same", "both_null", "miss", "added", "different")
MACHINERY = (
    "Machinery check: a scripted server replays recorded values only when their quote is in the text "
    "it was sent, and plays a reader that misses nothing it is shown (unless scripted to); these "
    "figures check the machinery, not a model."
)


class ChartSource(StrictModel):
    source: Literal["dataset", "fhir", "filler"] = Field(
        "dataset",
        description="dataset: the dataset's patients (multi-document JSONL, `verdict fhir load --out`); "
        "fhir: a Bundle file, a folder of Bundle files or a Bulk NDJSON folder (`path`, `at`); filler: "
        "each dataset note among other trials' criteria texts (a machinery check)",
    )
    path: str | None = Field(None, description="fhir: the source")
    at: dt.date | None = Field(None, description="fhir: the reference date (ages are computed at it)")
    filler_trials: str | None = Field(None, description="filler: trials JSONL (benchmarks layout)")
    filler_tokens: int = Field(8000, ge=0, description="filler: about this many tokens beside the note")
    data_class: Literal["public", "private"] | None = Field(
        None, description="default: the dataset's (fhir charts: private)"
    )


class ChartMiner(StrictModel, EndpointPlacement):
    """A value-miner endpoint on the programs of a `recorded` backend of the run."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.@+\-]{0,63}$")
    miner: EndpointRef
    programs: str = Field(description="a `recorded` backend of this run: its programs")
    prompts: dict[str, str] = Field(default_factory=dict, description="prompt version per stage")


class ChartReadingConfig(StrictModel):
    enabled: bool = Field(False, description="compare read once against exhaustive mining on long charts")
    backends: list[str] | None = Field(
        None, description="formalizer backends compared (default: every one); [] for none"
    )
    miners: list[ChartMiner] = Field(default_factory=list)
    charts: ChartSource = Field(default_factory=ChartSource)
    reading: ChartReading = Field(
        default_factory=ChartReading, description="how read once reads (as api.formalizer.reading)"
    )
    amortize_over: int = Field(300, ge=1, description="trials a patient is screened against (projection)")
    max_listed: int = Field(50, ge=0, description="misses and differences listed by atom in report.md")


class Work(StrictModel):
    """Model work of a method: calls (those answered from the cache count: they were calls once)."""

    calls: int = 0
    sent: int = Field(0, description="of which sent to a model in this run")
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, *usages) -> Work:
        return cls(
            calls=sum(u.calls_paid + u.cache_hits for u in usages),
            sent=sum(u.calls_paid for u in usages),
            prompt_tokens=sum(u.prompt_tokens for u in usages),
            completion_tokens=sum(u.completion_tokens for u in usages),
        )


class ModeOutcome(StrictModel):
    decision: DecisionValue
    tier: str
    mining: Work


class ChartPairRecord(StrictModel):
    """One pair (one program: a recorded variant is its own case) mined both ways; no text."""

    row: str
    pair_id: str
    case: str
    patient_id: str
    trial_id: str
    status: Literal["compared", "failed"]
    reason: str | None = None
    atoms: dict[str, Category] = Field(default_factory=dict)
    exhaustive: ModeOutcome | None = None
    read_once: ModeOutcome | None = None
    reading: Work | None = Field(None, description="the patient's one-time reading (None: mined directly)")
    reading_reused: bool = False
    documents: int = 0
    excerpts_kept: int = 0
    routed: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.row, self.pair_id, self.case)


def chart_store(run_dir: Path) -> JsonlStore[ChartPairRecord]:
    return JsonlStore(Path(run_dir) / CHART_FILE, ChartPairRecord, exclude_defaults=True)


# ---- comparing ------------------------------------------------------------------------------------
def _shown(mv) -> str | None:
    if mv is None or (mv.value is None and mv.bounds is None):
        return None
    bounds = mv.bounds.model_dump(mode="json") if mv.bounds is not None else None
    return json.dumps([mv.value, bounds], sort_keys=True, default=str)


def compare_atoms(names: list[str], exhaustive, read_once) -> dict[str, str]:
    """atom -> category of read once against exhaustive (`MinedValues` of each)."""
    ex = {mv.atom: _shown(mv) for mv in exhaustive}
    ro = {mv.atom: _shown(mv) for mv in read_once}
    out = {}
    for a in names:
        x, y = ex.get(a), ro.get(a)
        out[a] = (
            "both_null"
            if x is None and y is None
            else "miss"
            if y is None
            else "added"
            if x is None
            else "same"
            if x == y
            else "different"
        )
    return out


def fhir_charts(source: str, at: dt.date, data_class: str) -> tuple[dict[str, object], list[str]]:
    """patient id -> chart (its documents) from a Bundle file, a folder of Bundle files or a Bulk
    NDJSON folder (`data_gen/fhir`), and the problems met (by id or position, never by content)."""
    from verdict.data_gen.fhir.errors import FhirSourceError
    from verdict.data_gen.fhir.sources import load_source

    path = Path(source)
    bundles = path.is_dir() and not any(path.glob("*.ndjson"))
    charts, problems = {}, []
    for s in sorted(path.glob("*.json")) if bundles else [path]:
        try:
            loaded = load_source(str(s), at)
        except FhirSourceError as e:
            raise BenchError(f"chart_reading.charts: {e}") from None
        problems += loaded.problems
        for rec in loaded.records:
            doc = rec.patient_doc()
            if doc is None:
                problems.append(f"patient '{rec.patient_id}': no document to read")
            else:
                charts[doc.patient_id] = doc.model_copy(update={"data_class": data_class})
    return charts, problems


# ---- the rows: an endpoint and where its programs come from -----------------------------------------
@dataclass
class Row:
    name: str
    endpoint: object  # EndpointConfig of the value miner
    prompts: dict
    backend: object  # the formalizer backend (its parser), or the recorded backend
    recorded: dict | None = None  # pair id -> [RecordedPair] for a recorded backend


class ChartReadingStage:
    def __init__(self, config: ChartReadingConfig, ctx, backends: list, concurrency: int):
        self.config, self.ctx, self.concurrency = config, ctx, concurrency
        by_name = {b.name: b for b in backends}
        wanted = config.backends
        formal = [b for b in backends if b.kind == "formalizer" and (wanted is None or b.name in wanted)]
        unknown = [n for n in (wanted or []) if n not in by_name or by_name[n].kind != "formalizer"]
        if unknown:
            raise BenchError(
                f"chart_reading.backends: not a formalizer backend of this run: {', '.join(unknown)}"
            )
        self.rows = [Row(b.name, b.miner_ep, b.config.prompts.model_dump(), b) for b in formal]
        for m in config.miners:
            b = by_name.get(m.programs)
            if b is None or b.kind != "recorded":
                raise BenchError(f"chart_reading.miners '{m.name}': '{m.programs}' is not a recorded backend")
            ep = resolve_endpoint(m.miner, m, ctx.vllm_url, f"chart_reading miner '{m.name}'")
            self.rows.append(Row(m.name, ep, dict(m.prompts), b, recorded={}))
        names = [r.name for r in self.rows]
        if len(set(names)) < len(names):
            raise BenchError("chart_reading: the rows' names must be unique (backends and miners)")
        if not self.rows:
            raise BenchError("chart_reading.enabled needs a formalizer backend or chart_reading.miners")
        self.data_class = config.charts.data_class or (
            "private" if config.charts.source == "fhir" else ctx.dataset.data_class
        )
        self.problems: list[str] = []
        self._fz: dict[tuple[str, bool], object] = {}

    def preflight(self) -> None:
        for r in self.rows:
            self.ctx.egress.check_endpoint(
                r.endpoint,
                data_class=self.data_class,
                what=f"chart_reading '{r.name}' (value miner '{r.endpoint.name}')",
            )

    # -- inputs -----------------------------------------------------------------------------------
    def _recorded(self) -> None:
        from .long_charts import recorded_pair

        ds = self.ctx.dataset
        for r in self.rows:
            if r.recorded is None:
                continue
            for pair in ds.pairs:
                note = ds.patients.get(pair.patient_id)
                files = r.backend.files.get(pair.pair_id, [])
                if note is not None and files:
                    r.recorded[pair.pair_id] = [recorded_pair(f, note.text) for f in files]

    def charts(self) -> dict[str, object]:
        """patient id -> the long chart (a PatientDoc)."""
        c, ds = self.config.charts, self.ctx.dataset
        if c.source == "dataset":
            return {k: v.model_copy(update={"data_class": self.data_class}) for k, v in ds.patients.items()}
        if c.source == "fhir":
            if not c.path or c.at is None:
                raise BenchError("chart_reading.charts: source fhir needs path and at (the reference date)")
            charts, problems = fhir_charts(c.path, c.at, self.data_class)
            self.problems += problems
            return charts
        from verdict.data_gen.formalizer import qwen25_counter

        from .long_charts import chart_of, filler_documents

        if not c.filler_trials:
            raise BenchError("chart_reading.charts: source filler needs filler_trials (a trials JSONL)")
        quotes = {q for r in self.rows for ps in (r.recorded or {}).values() for p in ps for q in p.quotes()}
        docs = filler_documents(
            c.filler_trials,
            {p.trial_id for p in ds.pairs},
            c.filler_tokens,
            qwen25_counter().count_text,
            quotes,
        )
        return {pid: chart_of(pid, p.text, docs, self.data_class) for pid, p in ds.patients.items()}

    def formalizer(self, row: Row, read_once: bool):
        key = (row.name, read_once)
        if key not in self._fz:
            from verdict.data_gen.formalizer import Formalizer

            reading = self.config.reading.model_copy(update={"enabled": True}) if read_once else None
            self._fz[key] = Formalizer(
                row.endpoint,
                engine=self.ctx.engine,
                cache=self.ctx.cache(0),
                ledger=self.ctx.ledger,
                egress=self.ctx.egress,
                prompts=row.prompts,
                run=f"bench:{self.ctx.run_name}",
                reading=reading,
            )
        return self._fz[key]

    async def cases(self, row: Row, pair) -> list[tuple[str, object, str | None]]:
        """(case, program, why it failed) of the pair on this row; [] when the row has none."""
        if row.recorded is not None:
            return [(p.case, p.program, None) for p in row.recorded.get(pair.pair_id, [])]
        parsed = await row.backend.parsed(pair.trial_id, 0)
        if not parsed.accepted:
            return [(pair.trial_id, None, f"parser output rejected after one repair ({parsed.reason})")]
        return [(pair.trial_id, parsed.output, None)]

    # -- one pair ---------------------------------------------------------------------------------
    async def _decided(self, program, chart, mined) -> tuple[object, ModeOutcome]:
        from verdict.core.ranking import placement
        from verdict.data_gen.formalizer import resolved

        patient = resolved(program, chart.patient_id, mined, self.ctx.policy)
        d = await asyncio.to_thread(self.ctx.engine.decide, program, patient)
        work = Work.of(mined.inc.usage, mined.exc.usage)
        return d, ModeOutcome(decision=d.decision, tier=placement(d)[0], mining=work)

    async def _reading(self, fz, chart) -> Work:
        """The whole reading of this chart (every reader call, cached ones counted)."""
        from verdict.data_gen.formalizer import as_documents, sheet_key

        async def absent():
            raise BenchError("the chart's fact sheet is gone")

        sheet, _ = await fz.fact_sheets.get(sheet_key(fz, as_documents(chart), fz.reading.selection), absent)
        return Work.of(*(r.usage for r in sheet.results))

    async def one(self, row: Row, pair, case: str, program, chart) -> ChartPairRecord:
        from verdict.core.errors import PatientError
        from verdict.data_gen.formalizer import mine_pair, pair_cost, side_atoms

        rec = dict(
            row=row.name, pair_id=pair.pair_id, case=case, patient_id=pair.patient_id, trial_id=pair.trial_id
        )
        engine, policy = self.ctx.engine, self.ctx.policy
        ex, ro = await asyncio.gather(
            mine_pair(self.formalizer(row, False), engine, program, chart, policy, staged=False),
            mine_pair(self.formalizer(row, True), engine, program, chart, policy, staged=False),
        )
        bad = [
            f"{mode} {r.stage} output rejected after one repair ({r.reason})"
            for mode, m in (("exhaustive", ex), ("read once", ro))
            for r in (m.inc, m.exc)
            if not r.accepted
        ]
        if bad:
            return ChartPairRecord(**rec, status="failed", reason="; ".join(bad))
        try:
            _, ex_out = await self._decided(program, chart, ex)
            _, ro_out = await self._decided(program, chart, ro)
        except PatientError as e:
            return ChartPairRecord(
                **rec, status="failed", reason=f"value-miner output does not fit the program ({e.summary})"
            )
        names = list(dict.fromkeys(side_atoms(program, "inclusion") + side_atoms(program, "exclusion")))
        cost = pair_cost(ro.inc, ro.exc)
        read = next((r.chart_read for r in (ro.inc, ro.exc) if r.chart_read is not None), None)
        reading = None
        if cost.reading is not None:
            reading = await self._reading(self.formalizer(row, True), chart)
        return ChartPairRecord(
            **rec,
            status="compared",
            atoms=compare_atoms(names, ex.merged(), ro.merged()),
            exhaustive=ex_out,
            read_once=ro_out,
            reading=reading,
            reading_reused=cost.reading_reused,
            documents=read.documents if read is not None else len(chart.documents or []) or 1,
            excerpts_kept=read.excerpts_kept if read is not None else 0,
            routed=bool(
                read is not None and any(r.chart_read and r.chart_read.routed for r in (ro.inc, ro.exc))
            ),
        )

    async def run(self, run_dir: Path) -> tuple[str | None, float, int]:
        """Every pending comparison: (the budget stop's message if it stopped, paid USD, comparisons
        left for the next run after endpoint errors)."""
        await asyncio.to_thread(self._recorded)
        charts = await asyncio.to_thread(self.charts)
        ds = self.ctx.dataset
        missing = sorted({p.patient_id for p in ds.pairs if p.patient_id not in charts})
        self.problems += [f"patient '{m}': no chart (its pairs are not compared)" for m in missing]
        store = chart_store(run_dir)
        done = {x.key for x in store.load()}
        sem = asyncio.Semaphore(self.concurrency)
        state = Pending()
        ledger = self.ctx.ledger
        spent0 = ledger.spent if ledger is not None else None

        async def go(row: Row, pair):
            async with sem:
                if state.halted:
                    return
                with state.item(f"chart_reading {pair.pair_id} on {row.name}"):
                    for case, program, why in await self.cases(row, pair):
                        if (row.name, pair.pair_id, case) in done:
                            continue
                        rec = (
                            ChartPairRecord(
                                row=row.name,
                                pair_id=pair.pair_id,
                                case=case,
                                patient_id=pair.patient_id,
                                trial_id=pair.trial_id,
                                status="failed",
                                reason=why,
                            )
                            if program is None
                            else await self.one(row, pair, case, program, charts[pair.patient_id])
                        )
                        store.append(rec)

        # patient-major, so that each patient's reading is shared while its pairs are in flight
        todo = [
            (r, p)
            for r in self.rows
            for p in sorted(ds.pairs, key=lambda p: p.pair_id)
            if p.patient_id in charts
        ]
        try:
            await asyncio.gather(*(go(r, p) for r, p in todo))
        finally:
            store.close()
            for fz in self._fz.values():
                await fz.aclose()
        if spent0 is not None:
            state.paid = max(0.0, ledger.spent - spent0)
        return state.stop, state.paid, state.failed


# ---- the summary, the report, the comparison --------------------------------------------------------
def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _work_means(works: list[Work], over: float) -> dict:
    n = over or 1
    return {
        k: round(sum(getattr(w, k) for w in works) / n, 2)
        for k in ("calls", "prompt_tokens", "completion_tokens")
    }


def summarize_chart_reading(run_dir: Path, config, problems: list[str] | None = None) -> dict | None:
    from collections import Counter

    from .metrics import rate

    cfg = getattr(config, "chart_reading", None)
    if cfg is None or not cfg.enabled:
        return None
    path = Path(run_dir) / CHART_FILE
    recs = list(chart_store(run_dir).latest(lambda x: x.key).values()) if path.exists() else []
    rows, listed = {}, []
    for name in sorted({x.row for x in recs}):
        xs = [x for x in recs if x.row == name]
        ok = [x for x in xs if x.status == "compared"]
        cats = Counter(c for x in ok for c in x.atoms.values())
        n_atoms = sum(cats.values())
        readings: dict[str, Work] = {}
        for x in ok:  # one reading per patient (every pair of it records the same whole reading)
            if x.reading is not None:
                readings.setdefault(x.patient_id, x.reading)
        n = len(ok)
        per_patient = Counter(x.patient_id for x in ok)
        exhaustive = _work_means([x.exhaustive.mining for x in ok], n)
        mining = _work_means([x.read_once.mining for x in ok], n)
        reading_total = _work_means(list(readings.values()), 1)
        reading_each = _work_means(list(readings.values()), len(readings))
        run_amortized = {k: round(mining[k] + reading_total[k] / n, 2) if n else 0 for k in mining}
        projected = {k: round(mining[k] + reading_each[k] / cfg.amortize_over, 2) for k in mining}
        rows[name] = {
            "pairs": len({x.pair_id for x in ok}),
            "programs": n,
            "failed": dict(Counter(x.reason for x in xs if x.status == "failed")),
            "patients": len(per_patient),
            "charts_read": len(readings),
            "programs_per_patient": round(n / len(per_patient), 2) if per_patient else None,
            "documents_per_chart": _mean([x.documents for x in ok]),
            "excerpts_per_sheet": _mean([x.excerpts_kept for x in ok if x.reading is not None]),
            "routed_pairs": sum(x.routed for x in ok),
            "atoms": n_atoms,
            "categories": {c: rate(cats[c], n_atoms) for c in CATEGORIES},
            "atom_agreement": rate(cats["same"] + cats["both_null"], n_atoms),
            "same_decision": rate(sum(x.exhaustive.decision == x.read_once.decision for x in ok), n),
            "same_tier": rate(sum(x.exhaustive.tier == x.read_once.tier for x in ok), n),
            "cost": {
                "exhaustive": exhaustive,
                "read_once_mining": mining,
                "reading_per_patient": reading_each,
                "read_once_run": run_amortized,
                "read_once_projected": projected,
            },
        }
        for x in ok:
            for atom, c in x.atoms.items():
                if c in ("miss", "added", "different"):
                    listed.append(
                        {"row": name, "pair": x.pair_id, "case": x.case, "atom": atom, "category": c}
                    )
    return {
        "rows": rows,
        "listed": listed,
        "amortize_over": cfg.amortize_over,
        "max_listed": cfg.max_listed,
        "charts": cfg.charts.source,
        "problems": list(problems or []),
    }


def _k(r: dict) -> str:
    return f"{r['k']} ({r['rate']:.1%})" if r and r.get("rate") is not None else "0"


def render_chart_reading(s: dict, machinery_check: bool) -> list[str]:
    cr = s.get("chart_reading")
    if not cr:
        return []
    intro = [
        f"Charts: `{cr['charts']}`. Each pair mined twice by the same endpoint, both sides: exhaustive "
        "(every passage with every atom chunk) and read once (the chart read once into a fact sheet, "
        "routed to each atom chunk). A miss: read once null where exhaustive found a value. A pair has one "
        "program (a recorded pair: one per variant); decisions and costs are per program.",
        *(["", f"**{MACHINERY}**"] if machinery_check else []),
    ]
    columns = (
        "endpoint | pairs | programs | atoms | atom agreement [95% CI] | same value | both null | miss | "
        "added | different | same decision [95% CI] | same tier [95% CI]"
    )
    lines = section("Read once vs exhaustive mining (long charts)", columns, intro)
    for name, x in cr["rows"].items():
        c = x["categories"]
        lines.append(
            f"| {name} | {x['pairs']} | {x['programs']} | {x['atoms']} | {rate_text(x['atom_agreement'])} | "
            f"{_k(c['same'])} | "
            f"{_k(c['both_null'])} | {_k(c['miss'])} | {_k(c['added'])} | {_k(c['different'])} | "
            f"{rate_text(x['same_decision'])} | {rate_text(x['same_tier'])} |"
        )
    if not cr["rows"]:
        lines.append("| (no pair compared) | | | | | | | | | | | |")
    lines += [
        "",
        "Cost per program (calls, prompt and completion tokens; cached calls counted as the calls they "
        "were). The reading is paid once per patient: amortized over the patient's programs in this run, "
        f"and over {cr['amortize_over']} trials.",
        "",
        *table("endpoint | method | calls | prompt tokens | completion tokens"),
    ]
    labels = [
        ("exhaustive", "exhaustive mining"),
        ("read_once_mining", "read once: mining the sheet"),
        ("reading_per_patient", "read once: the reading, per patient (once)"),
        ("read_once_run", "read once, reading amortized over the programs here"),
        ("read_once_projected", f"read once, reading amortized over {cr['amortize_over']} trials"),
    ]
    for name, x in cr["rows"].items():
        for key, label in labels:
            w = x["cost"][key]
            if key == "read_once_run":
                label += f" ({x['programs_per_patient']} per patient)"
            lines.append(
                f"| {name} | {label} | {w['calls']} | {w['prompt_tokens']} | {w['completion_tokens']} |"
            )
    lines += [
        "",
        *table(
            "endpoint | patients | charts read once | documents per chart | excerpts per sheet | pairs routed"
        ),
    ]
    for name, x in cr["rows"].items():
        docs, exc = x["documents_per_chart"], x["excerpts_per_sheet"]
        lines.append(
            f"| {name} | {x['patients']} | {x['charts_read']} | {'n/a' if docs is None else f'{docs:.1f}'} | "
            f"{'n/a' if exc is None else f'{exc:.1f}'} | {x['routed_pairs']} |"
        )
    listed = cr["listed"]
    if listed:
        limit = cr.get("max_listed", 50)
        lines += ["", "Atoms where read once differs (miss: read once null, exhaustive found a value):", ""]
        lines += table("endpoint | pair | case | atom | category")
        lines += [
            f"| {d['row']} | {d['pair']} | {d['case']} | {d['atom']} | {d['category']} |"
            for d in listed[:limit]
        ]
        if len(listed) > limit:
            lines.append(f"| ... and {len(listed) - limit} more (results.json) | | | | |")
    fails = [(n, r, k) for n, x in cr["rows"].items() for r, k in x["failed"].items()]
    if fails:
        lines += ["", *table("endpoint | failed (why) | pairs")]
        lines += [f"| {n} | {r} | {k} |" for n, r, k in fails]
    if cr.get("problems"):
        lines += ["", "Charts skipped:", ""] + [f"- {p}" for p in cr["problems"][:50]]
    return lines


def compare_chart_reading(a: dict, b: dict) -> list[str]:
    """Both runs' read-once rows side by side (`verdict bench compare`)."""
    columns = (
        "endpoint | pairs | atom agreement | misses | same decision | calls/pair exhaustive | "
        "calls/pair read once (amortized) | prompt tokens/pair exhaustive | "
        "prompt tokens/pair read once"
    )
    return side_by_side(a, b, "chart_reading", "Read once vs exhaustive mining:", columns, _compared_rows)


def _compared_rows(cr: dict) -> list[list]:
    """A run's read-once rows as `verdict bench compare` shows them."""
    out = []
    for name, x in (cr.get("rows") or {}).items():
        c = x["cost"]
        out.append(
            [
                name,
                x["pairs"],
                rate_text(x["atom_agreement"]),
                x["categories"]["miss"]["k"],
                rate_text(x["same_decision"]),
                c["exhaustive"]["calls"],
                c["read_once_projected"]["calls"],
                c["exhaustive"]["prompt_tokens"],
                c["read_once_projected"]["prompt_tokens"],
            ]
        )
    return out
