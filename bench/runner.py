"""A benchmark run: every backend over every labelled pair (times the repeats), then the scores.

    run = BenchRun(load_bench_config("trec2021-gpt-5-mini"))
    outcome = asyncio.run(run.run())        # -> runs/bench/NAME/{results.json, report.md, plots/}

Resumable: each pair's result is appended to ``pairs.jsonl`` (the project's JSONL record store,
`verdict.core.jsonl_store`) as soon as it is known, and a run started again skips what is there
(a line torn by a kill is cut and its pair redone); formalizer calls go through the shared call
cache, so an answer paid for (by this run, an interrupted one, or a teacher run) is never paid for
again. A pair whose endpoint kept failing is not recorded: the next run tries it again. The run
directory keeps the config, and refuses to mix results of a different dataset, backends or policy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from verdict.core import configs
from verdict.core.engine import Engine
from verdict.core.jsonl_store import JsonlStore
from verdict.core.policy import load_policy
from verdict.core.progress import Progress, to_stderr
from verdict.data_gen.formalizer import EgressPolicy, EgressRefused, Ledger

from .backends import RunContext, make_backend
from .bench_config import BenchConfig
from .chart_reading import ChartReadingStage
from .counterfactual import CounterfactualStage
from .datasets import BenchDataset, load_dataset
from .pending import Pending
from .protocol import BenchError
from .report import pair_store

FATAL_STATUS = {401, 403, 404}  # wrong key, no access, unknown model: every further call fails too


@dataclass
class RunOutcome:
    run_dir: Path
    status: str = "complete"  # complete | incomplete | stopped_budget
    pairs_total: int = 0
    done_before: int = 0
    done_now: int = 0
    endpoint_failures: int = 0
    paid_usd: float = 0.0
    message: str = ""
    elapsed_s: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


class BenchRun:
    def __init__(
        self,
        config: BenchConfig,
        *,
        progress_bar: bool = True,
        restart: bool = False,
        progress: Progress = to_stderr,
    ):
        self.config = config
        self.progress_bar = progress_bar
        self.restart = restart
        self.progress = progress
        self.dir = config.run_dir

    # -- the run directory ------------------------------------------------------------------------
    def prepare_dir(self) -> None:
        """Create the run directory, or check that it holds this config's work."""
        cfg_path = self.dir / "config.yaml"
        if cfg_path.exists() and not self.restart:
            try:
                old = configs.load(BenchConfig, cfg_path, None, f"bench config {cfg_path.name}", BenchError)
            except ValueError as e:  # a BenchError, or a model check outside validation
                raise BenchError(
                    f"{cfg_path} is not a readable bench config: pass --restart to start the run over",
                    getattr(e, "problems", None),
                ) from None
            a, b = old.work_identity(), self.config.work_identity()
            if a != b:
                differ = [k for k in a if a[k] != b[k]]
                raise BenchError(
                    f"run directory {self.dir} holds results of another config ({', '.join(differ)} "
                    "differ): use another name, or --restart to discard them"
                )
        if self.restart and self.dir.exists():
            for name in (
                "pairs.jsonl",
                "counterfactual.jsonl",
                "chart_reading.jsonl",
                "results.json",
                "report.md",
            ):
                (self.dir / name).unlink(missing_ok=True)
            for f in self.dir.glob("cache-repeat-*.sqlite*"):
                f.unlink()
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.config.model_dump(mode="json", exclude_none=False)
        cfg_path.write_text(
            "# Written by `verdict bench run`: rerun with `verdict bench run --config "
            f"{cfg_path}`\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        )

    # -- the run ------------------------------------------------------------------------------------
    async def run(self) -> RunOutcome:
        """Every backend over every pending pair (times the repeats), then the opt-in stages; the
        outputs are written from whatever finished, also after a stop."""
        started = time.monotonic()
        cfg = self.config
        dataset = load_dataset(cfg.dataset)
        policy = load_policy(cfg.policy)
        self.prepare_dir()
        handler = _file_log(self.dir / "run.log")
        store = pair_store(self.dir)  # the first append cuts a line torn by a kill: its pair is redone
        done = {r.key: r for r in store.load()}
        outcome = RunOutcome(run_dir=self.dir, done_before=len(done))
        _write_dataset(self.dir, dataset)
        server = None
        ctx = None
        backends = []
        try:
            server = self._vllm_server()
            ctx = self._context(dataset, policy, server)
            backends = [make_backend(b, ctx) for b in cfg.backends]
            cf, charts = self._preflight(backends, ctx)
            if _makes_calls(backends, cf, charts):
                ctx.ledger = Ledger(ctx.cache(0), f"bench:{cfg.name}", cfg.budget_usd)
            problems = [p for b in backends for p in b.problems()] + store.problems
            self._announce(dataset, backends, problems)
            if server is not None:
                self.progress(f"starting vLLM ({cfg.vllm.model}) for the local students ...")
                await asyncio.to_thread(server.start)
            outcome.pairs_total = len(dataset.all_pairs) * len(backends) * cfg.repeats
            await self._run_backends(backends, dataset, done, store, outcome)
            problems += await self._run_stages(cf, charts, done, outcome)
            _mark_endpoint_failures(outcome)
        finally:
            await _close(backends, server, ctx, handler, store)
        outcome.elapsed_s = time.monotonic() - started
        outcome.files = self.write_outputs(dataset, problems, status=outcome.status)
        return outcome

    def _context(self, dataset: BenchDataset, policy, server) -> RunContext:
        """What every backend and stage of the run shares: dataset, engine, policy, cache, egress, vLLM."""
        cfg = self.config
        return RunContext(
            dataset=dataset,
            engine=Engine(timeout_ms=cfg.solver_timeout_ms),
            policy=policy,
            run_name=cfg.name,
            run_dir=self.dir,
            cache_path=Path(cfg.cache),
            egress=EgressPolicy.from_config(cfg.egress),
            vllm_url=server.base_url if server is not None else None,
        )

    def _preflight(
        self, backends: list, ctx: RunContext
    ) -> tuple[CounterfactualStage | None, ChartReadingStage | None]:
        """Check every backend and opt-in stage before anything is sent, vLLM started or money spent;
        the stages the config turns on."""
        cfg = self.config
        for b in backends:
            b.preflight()
        cf = None
        if cfg.counterfactual.enabled:
            cf = CounterfactualStage(cfg.counterfactual, ctx, backends, cfg.concurrency)
            cf.preflight()
        charts = None
        if cfg.chart_reading.enabled:
            charts = ChartReadingStage(cfg.chart_reading, ctx, backends, cfg.concurrency)
            charts.preflight()
        return cf, charts

    def _announce(self, dataset: BenchDataset, backends: list, problems: list[str]) -> None:
        """The run's plan in one progress line, then the first input rows skipped."""
        cfg = self.config
        c = dataset.counts()
        self.progress(
            f"bench {cfg.name}: {dataset.kind}: {len(dataset.all_pairs)} pairs ({c['eligible']} eligible, "
            f"{c['ineligible']} ineligible); {len(dataset.problems)} input rows skipped"
            + (
                f", dropped {', '.join(f'{v} {k}' for k, v in dataset.dropped.items())}"
                if dataset.dropped
                else ""
            )
            + (
                f"; {len(dataset.ranking_pairs)} not-relevant pairs for the ranking only"
                if dataset.ranking_pairs
                else ""
            )
            + f"; {len(backends)} backend(s) x {cfg.repeats} repeat(s)"
        )
        for p in (dataset.problems + problems)[:10]:
            self.progress(f"  skipped: {p}")
        if len(dataset.problems) + len(problems) > 10:
            self.progress(f"  ... and {len(dataset.problems) + len(problems) - 10} more (see report.md)")

    async def _run_backends(
        self, backends: list, dataset: BenchDataset, done: dict, store: JsonlStore, outcome: RunOutcome
    ) -> None:
        """Each backend's repeats in turn; a budget stop ends the run, a fatal error propagates."""
        for b in backends:
            for r in range(self.config.repeats):
                stop = await self._run_backend(b, r, dataset, done, store, outcome)
                if stop:
                    break
            if outcome.status == "stopped_budget":
                break

    async def _run_stages(
        self,
        cf: CounterfactualStage | None,
        charts: ChartReadingStage | None,
        done: dict,
        outcome: RunOutcome,
    ) -> list[str]:
        """The opt-in stages, each only while the run is complete so far; the problems they report."""
        problems: list[str] = []
        if cf is not None and outcome.status == "complete":
            self.progress("counterfactual stage: modifier -> validator -> the backend again")
            _count_stage(outcome, *await cf.run(done, self.dir))
        if charts is not None and outcome.status == "complete":
            self.progress("chart_reading stage: each pair mined exhaustively and from the chart read once")
            _count_stage(outcome, *await charts.run(self.dir))
            problems += charts.problems
        return problems

    def _vllm_server(self):
        cfg = self.config
        if cfg.vllm is None or not any(getattr(b, "local_vllm", False) for b in cfg.backends):
            return None
        from verdict.serve.vllm.server import VLLMServer

        return VLLMServer(cfg.vllm)

    async def _run_backend(
        self, backend, repeat: int, dataset: BenchDataset, done: dict, store: JsonlStore, outcome: RunOutcome
    ) -> bool:
        """Decide the backend's pending pairs; True if the run must stop (budget, fatal error)."""
        todo = dataset.all_pairs
        pending = [p for p in todo if (backend.name, repeat, p.pair_id) not in done]
        label = f"{backend.name} r{repeat}"
        if not pending:
            self.progress(f"{label}: all {len(todo)} pairs done before")
            return False
        self.progress(f"{label}: {len(pending)} of {len(todo)} pairs to go")
        bar = _progress(len(pending), self.progress_bar, label)
        sem = asyncio.Semaphore(self.config.concurrency)
        state = Pending()

        async def one(pair):
            async with sem:
                if state.halted:
                    return
                with state.item(f"pair {pair.pair_id} on {backend.name}", FATAL_STATUS):
                    try:
                        why = backend.unavailable(pair)
                        if why:
                            res = backend.result(pair, repeat, status="unavailable", reason=why)
                        else:
                            res = await backend.decide(pair, repeat)
                    except EgressRefused as e:
                        state.fatal = state.fatal or e
                        return
                    store.append(res)
                    done[res.key] = res
                    outcome.done_now += 1
                    state.paid += sum(s.paid_usd for s in res.stages.values() if not s.shared)
                    bar.set_postfix_str(f"failed={state.failed} paid=${state.paid:.4f}", refresh=False)
                    bar.update(1)

        try:
            await asyncio.gather(*(one(p) for p in pending))
        finally:
            bar.close()
        outcome.endpoint_failures += state.failed
        outcome.paid_usd += state.paid
        if state.fatal is not None:
            raise state.fatal
        if state.stop:
            outcome.status = "stopped_budget"
            outcome.message = state.stop
            return True
        return False

    # -- outputs ------------------------------------------------------------------------------------
    def write_outputs(
        self, dataset: BenchDataset | None = None, problems: list[str] | None = None, status: str = "complete"
    ) -> dict[str, str]:
        """results.json, report.md and plots/ from everything in pairs.jsonl (also after a stop)."""
        from .chart_reading import summarize_chart_reading
        from .counterfactual import summarize_cf
        from .plots import write_plots
        from .report import load_pairs, render_markdown, summarize

        if dataset is None:
            dataset = load_dataset(self.config.dataset)
        results = load_pairs(self.dir)
        summary = summarize(self.config, dataset, results, problems or [], status=status)
        summary["counterfactual"] = summarize_cf(self.dir, self.config)
        summary["chart_reading"] = summarize_chart_reading(self.dir, self.config)
        plots = write_plots(summary, self.dir / "plots")
        summary["plots"] = [str(p.relative_to(self.dir)) for p in plots]
        (self.dir / "results.json").write_text(json.dumps(summary, indent=2))
        (self.dir / "report.md").write_text(render_markdown(summary))
        return {
            "results": str(self.dir / "results.json"),
            "report": str(self.dir / "report.md"),
            **{p.stem: str(p) for p in plots},
        }


def _write_dataset(run_dir: Path, dataset: BenchDataset) -> None:
    """dataset.json beside the results: the dataset's summary and every pair it holds."""
    (run_dir / "dataset.json").write_text(
        json.dumps({**dataset.summary(), "pairs_list": [p.model_dump() for p in dataset.pairs]}, indent=1)
    )


def _makes_calls(backends: list, cf: CounterfactualStage | None, charts: ChartReadingStage | None) -> bool:
    """Whether anything in the run calls a model endpoint (then a ledger holds it to the budget)."""
    return (
        cf is not None or charts is not None or any(b.kind in ("formalizer", "llm_match") for b in backends)
    )


def _count_stage(outcome: RunOutcome, stop: str | None, paid: float, failed: int) -> None:
    """A stage's payments and endpoint failures into the outcome; its budget stop stops the run."""
    outcome.paid_usd += paid
    outcome.endpoint_failures += failed
    if stop:
        outcome.status, outcome.message = "stopped_budget", stop


def _mark_endpoint_failures(outcome: RunOutcome) -> None:
    """A run that left pairs to endpoint errors is incomplete: the same command retries them."""
    if outcome.endpoint_failures and outcome.status == "complete":
        outcome.status = "incomplete"
        outcome.message = (
            f"{outcome.endpoint_failures} pair(s) failed with endpoint errors and were not "
            "recorded: run the same command again to retry them"
        )


async def _close(
    backends: list, server, ctx: RunContext | None, handler: logging.Handler, store: JsonlStore
) -> None:
    """Release what the run opened, also after an error: backends, vLLM, caches, its log file, the store."""
    for b in backends:
        await b.aclose()
    if server is not None:
        await asyncio.to_thread(server.stop)
    if ctx is not None:
        ctx.close()
    logging.getLogger("verdict.bench").removeHandler(handler)
    logging.getLogger("verdict.data_gen").removeHandler(handler)
    handler.close()
    store.close()


def _progress(total: int, enabled: bool, label: str):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=label,
        unit="pair",
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
    )


def _file_log(path: Path) -> logging.Handler:
    """The run's log (ids, categories and counts only: never patient text)."""
    h = logging.FileHandler(path)
    h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("bench", "data_gen"):
        lg = logging.getLogger(name)
        lg.addHandler(h)
        if lg.level == logging.NOTSET or lg.level > logging.INFO:
            lg.setLevel(logging.INFO)
    return h
