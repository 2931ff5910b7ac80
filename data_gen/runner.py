"""A teacher run: the formalizer stages over a run config's trials and patient-trial pairs.

    run = TeacherRun(load_run_config("sigir-subset"), budget_usd=5.0)
    summary = asyncio.run(run.run())          # or run.dry_run() to estimate first

Work: the parser stage for each trial (one call per criterion, assembled into the trial's program;
a criterion that recurs across trials is one call); for each accepted program, the value-miner
inclusion and exclusion passes for each of the trial's pairs. Items run concurrently (bounded per teacher) and
each result is recorded as soon as it is checked, so a run interrupted at any moment (`kill -9`
included) resumes where it stopped: recorded items are skipped, answered calls come from the
cache, and only calls whose answer never arrived are sent again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verdict.core.engine import Engine
from verdict.core.program import TrialProgram
from verdict.data_gen.formalizer import (
    BudgetExhausted,
    CallCache,
    ConfigError,
    EgressPolicy,
    EgressRefused,
    EndpointConfig,
    EndpointError,
    Ledger,
    Pair,
    PatientDoc,
    TrialDoc,
    estimate_prompt_tokens,
    load_teacher,
)

from .formalizer import Formalizer, side_atoms
from .records import RecordStore, record_id
from .sources import load_pairs, load_patients, load_trials
from .teacher_config import RunConfig

log = logging.getLogger("verdict.data_gen.runner")
FATAL_STATUS = {401, 403, 404}  # wrong key, no access, unknown model: every further call would fail too


@dataclass
class Plan:
    trials: list[TrialDoc]
    patients: dict[str, PatientDoc]
    pairs: list[Pair]
    problems: list[str] = field(default_factory=list)

    def pairs_of(self, trial_id: str) -> list[Pair]:
        return [p for p in self.pairs if p.trial_id == trial_id]


@dataclass
class RunSummary:
    run: str
    status: str  # complete | stopped_budget | incomplete
    items_done: int = 0
    accepted: int = 0
    rejected: int = 0
    failed: int = 0
    skipped: int = 0
    calls_paid: int = 0
    cache_hits: int = 0
    cost_usd: float = 0.0
    spent_total_usd: float = 0.0
    lost_in_flight: int = 0
    records_total: int = 0
    elapsed_s: float = 0.0
    message: str = ""


@dataclass
class StageEstimate:
    items: int = 0
    cached_calls: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    max_completion_tokens: int = 0
    max_cost_usd: float = 0.0
    estimated_from_criteria: int = 0  # miner items whose program is not parsed yet


def run_dir(config: RunConfig) -> Path:
    return Path(config.out_dir) / config.name


def plan_run(config: RunConfig) -> Plan:
    t = config.trials
    trials = load_trials(t.path, t.format, t.ids, t.limit)
    problems = list(trials.problems)
    patients: dict[str, PatientDoc] = {}
    pairs: list[Pair] = []
    if config.patients is not None and any(s != "parser" for s in config.stages):
        p = config.patients
        loaded = load_patients(p.path, p.ids, p.limit, data_class=p.data_class)
        problems += loaded.problems
        patients = loaded.by_id("patient_id")
        tids = {x.trial_id for x in trials.items}
        if config.pairs is not None:
            lp = load_pairs(config.pairs.path, config.pairs.scores)
            problems += lp.problems
            pairs = [x for x in lp.items if x.trial_id in tids and x.patient_id in patients]
            if config.pairs.limit is not None:
                pairs = pairs[: config.pairs.limit]
        else:
            pairs = [Pair(patient_id=pid, trial_id=tr.trial_id) for tr in trials.items for pid in patients]
    return Plan(trials=trials.items, patients=patients, pairs=pairs, problems=problems)


class TeacherRun:
    def __init__(
        self,
        config: RunConfig,
        *,
        budget_usd: float | None = None,
        progress_bar: bool = True,
        teachers: dict[str, EndpointConfig] | None = None,
    ):
        self.config = config
        self.budget = budget_usd if budget_usd is not None else config.budget_usd
        self.progress_bar = progress_bar
        self.dir = run_dir(config)
        self.egress = EgressPolicy.from_config(config.egress)
        self.teachers = teachers or {}
        for stage in config.stages:
            name = config.teacher_for(stage)
            if name not in self.teachers:
                self.teachers[name] = load_teacher(name)

    def teacher(self, stage: str) -> EndpointConfig:
        return self.teachers[self.config.teacher_for(stage)]

    @property
    def prompts(self) -> dict[str, str]:
        return self.config.prompts.model_dump()

    # -- checks before anything is sent -----------------------------------------------------------
    def preflight(self, plan: Plan) -> None:
        """Refuse the whole run before any request if a stage would send patient text off-site."""
        if not plan.trials:
            raise ConfigError(
                "no trials to work on" + (": " + "; ".join(plan.problems[:5]) if plan.problems else "")
            )
        p = self.config.patients
        for stage in self.config.stages:
            if stage == "parser" or p is None:
                continue
            t = self.teacher(stage)
            self.egress.check_endpoint(
                t, data_class=p.data_class, what=f"stage '{stage}' of teacher '{t.name}'"
            )

    # -- the run ------------------------------------------------------------------------------------
    async def run(self) -> RunSummary:
        started = time.monotonic()
        plan = plan_run(self.config)
        self.preflight(plan)
        self.dir.mkdir(parents=True, exist_ok=True)
        handler = _file_log(self.dir / "run.log")
        cache = CallCache(self.config.cache)
        store = RecordStore(self.dir / "records.sqlite")
        summary = RunSummary(run=self.config.name, status="incomplete")
        try:
            for problem in plan.problems:
                log.warning("input problem: %s", problem)
            lost = cache.inflight(self.config.name)
            if lost:
                summary.lost_in_flight = len(lost)
                log.warning(
                    "%d call(s) were in flight when this run last stopped; their answers never arrived, "
                    "so they may be sent again",
                    len(lost),
                )
                cache.clear_inflight(self.config.name)
            store.set_meta("config", self.config.model_dump(mode="json"))
            store.set_meta("cache", str(Path(self.config.cache).resolve()))
            store.set_meta("status", "running")
            ledger = Ledger(cache, self.config.name, self.budget)
            engine = Engine()  # the run's one engine: every teacher's outputs are checked by it
            fzs = {
                name: Formalizer(
                    t,
                    engine=engine,
                    cache=cache,
                    ledger=ledger,
                    egress=self.egress,
                    prompts=self.prompts,
                    run=self.config.name,
                )
                for name, t in self.teachers.items()
            }
            try:
                await _Work(self, plan, store, fzs, summary).run()
            finally:
                for fz in fzs.values():
                    await fz.aclose()
            summary.spent_total_usd = ledger.spent
            summary.records_total = len(store.done_ids())
            summary.elapsed_s = time.monotonic() - started
            store.set_meta("status", summary.status)
            store.set_meta("last_summary", asdict(summary))
            log.info("run %s: %s", self.config.name, json.dumps(asdict(summary)))
            return summary
        finally:
            store.close()
            cache.close()
            logging.getLogger("verdict.data_gen").removeHandler(handler)
            handler.close()

    # -- the dry run --------------------------------------------------------------------------------
    def dry_run(self) -> dict:
        """Tokens and worst-case cost of the calls a run would send now; nothing is sent."""
        plan = plan_run(self.config)
        self.preflight(plan)
        cache = CallCache(self.config.cache) if Path(self.config.cache).exists() else None
        store_path = self.dir / "records.sqlite"
        store = RecordStore(store_path) if store_path.exists() else None
        done = store.done_ids() if store else set()
        programs = store.programs() if store else {}
        est: dict[str, StageEstimate] = {}
        fzs = {
            name: Formalizer(t, egress=self.egress, prompts=self.prompts, run=self.config.name)
            for name, t in self.teachers.items()
        }

        seen: set[str] = set()

        def count(stage: str, messages, key: tuple | None, guess: bool = False):
            e = est.setdefault(stage, StageEstimate())
            e.items += 1
            t = self.teacher(stage)
            if key is not None and (key[0] in seen or (cache is not None and cache.get(key[0]) is not None)):
                e.cached_calls += 1  # answered before, or the same prompt as another item (one shared call)
                return
            if key is not None:
                seen.add(key[0])
            e.calls += 1
            e.estimated_from_criteria += int(guess)
            e.prompt_tokens += estimate_prompt_tokens(messages)
            e.max_completion_tokens += t.max_tokens.for_stage(stage)
            e.max_cost_usd += t.prices.cost(estimate_prompt_tokens(messages), t.max_tokens.for_stage(stage))

        from .formalizer import core_schema, with_atom_enum

        for trial in plan.trials:
            if "parser" in self.config.stages and record_id("parser", trial.trial_id) not in done:
                fz = fzs[self.config.teacher_for("parser")]
                for c in fz.trial_criteria(trial).criteria:  # one call per criterion; repeats share one
                    msgs = fz.criterion_messages(c)
                    count(
                        "parser",
                        msgs,
                        fz.request_key("parser", msgs, core_schema("parsed-criterion"), "parsed_criterion"),
                    )
            for pair in plan.pairs_of(trial.trial_id):
                for side in ("inclusion", "exclusion"):
                    stage = f"miner_{side}"
                    if (
                        stage not in self.config.stages
                        or record_id(stage, trial.trial_id, pair.patient_id) in done
                    ):
                        continue
                    fz = fzs[self.config.teacher_for(stage)]
                    note = plan.patients[pair.patient_id].text
                    if trial.trial_id in programs:
                        program = TrialProgram.model_validate_json(programs[trial.trial_id])
                        names = side_atoms(program, side)
                        if not names:
                            continue
                        msgs = fz.miner_messages(program, note, side, names)
                        schema = with_atom_enum(core_schema("value-miner"), names)
                        count(stage, msgs, fz.request_key(stage, msgs, schema, "value_miner_output"))
                    else:  # program not parsed yet: the criteria text stands in for the atom list
                        msgs = fz.prompt(stage).render(NOTE=note, ATOMS=trial.criteria_text())
                        count(stage, msgs, None, guess=True)
        if store:
            store.close()
        if cache:
            cache.close()
        total = StageEstimate()
        for e in est.values():
            for k in asdict(total):
                setattr(total, k, getattr(total, k) + getattr(e, k))
        return {
            "run": self.config.name,
            "budget_usd": self.budget,
            "problems": plan.problems,
            "stages": {k: asdict(v) for k, v in est.items()},
            "total": asdict(total),
        }


class _Work:
    """The concurrent part of one run: a queue of items and a pool of workers."""

    def __init__(
        self, run: TeacherRun, plan: Plan, store: RecordStore, fzs: dict[str, Formalizer], summary: RunSummary
    ):
        self.owner, self.plan, self.store, self.fzs, self.summary = run, plan, store, fzs, summary
        self.cfg = run.config
        self.done = store.done_ids()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stop_reason: str | None = None
        self.fatal: BaseException | None = None
        self.bar = None

    def fz(self, stage: str) -> Formalizer:
        return self.fzs[self.cfg.teacher_for(stage)]

    def _mining_items(self, trial_id: str) -> list[tuple[str, str]]:
        """(side, patient_id) of the value-miner items of a trial that are not recorded yet."""
        return [
            (side, pair.patient_id)
            for pair in self.plan.pairs_of(trial_id)
            for side in ("inclusion", "exclusion")
            if f"miner_{side}" in self.cfg.stages
            and record_id(f"miner_{side}", trial_id, pair.patient_id) not in self.done
        ]

    def _enqueue_mining(self, program: TrialProgram) -> int:
        items = self._mining_items(program.trial_id)
        for side, patient_id in items:
            self.queue.put_nowait(("miner", side, program, patient_id))
        return len(items)

    async def run(self) -> None:
        programs = self.store.programs()
        total = 0
        for trial in self.plan.trials:
            if "parser" in self.cfg.stages and record_id("parser", trial.trial_id) not in self.done:
                self.queue.put_nowait(("parser", trial))
                total += 1 + len(self._mining_items(trial.trial_id))  # expected; corrected when parsed
            elif trial.trial_id in programs:
                total += self._enqueue_mining(TrialProgram.model_validate_json(programs[trial.trial_id]))
        self.bar = _progress(total, self.owner.progress_bar, self.cfg.name)
        # More workers than HTTP slots: an item waiting on a shared call or being checked holds no slot,
        # and the clients' semaphores bound what is actually in flight.
        n_workers = min(1024, 4 * sum(t.concurrency for t in self.owner.teachers.values()))
        workers = [asyncio.create_task(self._worker()) for _ in range(max(1, n_workers))]
        try:
            await self.queue.join()
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self.bar.close()
        if self.fatal is not None:
            raise self.fatal
        s = self.summary
        if self.stop_reason:
            s.status, s.message = "stopped_budget", self.stop_reason
        elif s.failed:
            s.status = "incomplete"
            s.message = (
                f"{s.failed} item(s) failed (endpoint errors); run the same command again to retry them"
            )
        else:
            s.status = "complete"

    async def _worker(self) -> None:
        while True:
            item = await self.queue.get()
            try:
                if self.stop_reason is None and self.fatal is None:
                    await self._process(item)
            except BudgetExhausted as e:
                if self.stop_reason is None:
                    self.stop_reason = str(e)
                    log.warning("%s", e)
            except EndpointError as e:
                if e.status in FATAL_STATUS:
                    self.fatal = self.fatal or e
                else:
                    self.summary.failed += 1
                    log.warning("item failed: %s", e.summary)
            except (EgressRefused, ConfigError) as e:
                self.fatal = self.fatal or e
            except Exception as e:  # a bug must not lose the run's other work; the item stays undone
                self.summary.failed += 1
                log.exception("item failed with an internal error: %s", type(e).__name__)
            finally:
                self.queue.task_done()

    async def _process(self, item) -> None:
        s = self.summary
        if item[0] == "parser":
            trial: TrialDoc = item[1]
            expected = len(self._mining_items(trial.trial_id))
            res = await self.fz("parser").parse_trial(trial)
            self.store.put(res, trial.trial_id)
            added = self._enqueue_mining(res.output) if res.accepted else 0
            self.bar.total += added - expected
        else:
            _, side, program, patient_id = item
            stage = f"miner_{side}"
            if not side_atoms(program, side):  # the trial has no criteria on this side: nothing to ask
                s.skipped += 1
                self.bar.update(1)
                return
            res = await self.fz(stage).mine_values(program, self.plan.patients[patient_id], side)
            self.store.put(res, program.trial_id, patient_id)
        s.items_done += 1
        s.accepted += res.accepted
        s.rejected += not res.accepted
        s.calls_paid += res.usage.calls_paid
        s.cache_hits += res.usage.cache_hits
        s.cost_usd += res.usage.paid_usd
        self.bar.set_postfix_str(
            f"cost=${s.cost_usd:.4f} ok={s.accepted} rej={s.rejected} hits={s.cache_hits}", refresh=False
        )
        self.bar.update(1)


def _progress(total: int, enabled: bool, name: str):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=f"teacher run {name}",
        unit="item",
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def _file_log(path: Path) -> logging.Handler:
    h = logging.FileHandler(path)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("verdict.data_gen")
    root.addHandler(h)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    os.environ.setdefault("TQDM_MININTERVAL", "0.5")
    return h
