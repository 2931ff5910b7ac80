"""Re-screening without any LLM call: re-decide the stored resolved patients with the core after a
policy changed version (`policy`) or a trial got a new program version (`trial_id`).

    report = rescreen(store, engine, policy="prescreen")      # or trial_id="NCT01234567"

Only *current* decisions are re-decided (those no review or earlier re-screening superseded).
- policy: the current decisions under that policy name whose policy version differs from the
  policy file's; each is re-derived (rederive.py) for its own program version.
- trial: the trial's current decisions on another program version than the active one. Resolved
  values are reused only when the new version's atoms are the same (names, domains, units, kinds,
  definitions, time scopes); otherwise the pair is listed as `needs_miner` and not decided.
A decision whose label changes is written as a new decision superseding the old one (lineage kind
`rescreen`); the others are reported as `unchanged` and nothing is written for them. Every write
commits on its own, so an interrupted run resumes where it stopped, and a second run writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verdict.core.engine import Engine
from verdict.core.errors import VerdictError
from verdict.core.policy import Policy, load_policy
from verdict.core.program import TrialProgram, load_program
from verdict.data_gen.formalizer import EndpointClient

from ..api_config import ApiConfig
from ..audit import AuditStore, DecisionRow
from ..audit.store import Superseded, open_store
from ..config import load_serve_config
from .protocol import Lineage, RecordedChange
from .reading import policy_reasons
from .rederive import conflict_atoms, rederive, same_atoms
from .serving import Successor, stored_patient, superseding_decision


@dataclass
class RescreenItem:
    decision_id: str
    trial_id: str
    patient_id: str
    status: str  # changed | unchanged | needs_miner | superseded | error
    old: str
    new: str | None = None
    new_decision_id: str | None = None
    old_version: str = ""  # policy version or program hash before
    new_version: str = ""
    message: str | None = None


@dataclass
class RescreenReport:
    trigger: dict
    items: list[RescreenItem] = field(default_factory=list)
    llm_calls: int = 0

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for it in self.items:
            out[it.status] = out.get(it.status, 0) + 1
        return out

    @property
    def changed(self) -> list[RescreenItem]:
        return [it for it in self.items if it.status == "changed"]

    def as_json(self) -> dict:
        return {
            "trigger": self.trigger,
            "llm_calls": self.llm_calls,
            "counts": self.counts,
            "items": [asdict(it) for it in self.items],
        }


@contextlib.contextmanager
def count_llm_calls():
    """Counts every formalizer call this process sends while inside: `EndpointClient.complete` is
    the one place a call to a language model leaves the process (the teacher ledger's calls too)."""

    counter = {"calls": 0}
    original = EndpointClient.complete

    async def counted(self, *args, **kwargs):
        counter["calls"] += 1
        return await original(self, *args, **kwargs)

    EndpointClient.complete = counted
    try:
        yield counter
    finally:
        EndpointClient.complete = original


def rescreen(
    store: AuditStore,
    engine: Engine,
    *,
    policy: str | None = None,
    trial_id: str | None = None,
    caller: str = "rescreen",
) -> RescreenReport:
    if (policy is None) == (trial_id is None):
        raise VerdictError("give a policy or a trial to re-screen for")
    with count_llm_calls() as calls:
        report = _rescreen(store, engine, policy, trial_id, caller)
    report.llm_calls = calls["calls"]
    return report


def _rescreen(store, engine, policy_name, trial_id, caller) -> RescreenReport:
    programs: dict[str, TrialProgram] = {}

    def program(trial: str, program_hash: str) -> TrialProgram:
        if program_hash not in programs:
            row = store.trial_version(trial, program_hash)
            if row is None:
                raise VerdictError(f"trial '{trial}' version {program_hash} is not in the store")
            programs[program_hash] = load_program(row.program_json)
        return programs[program_hash]

    if policy_name is not None:
        policy = load_policy(policy_name)
        report = RescreenReport(trigger={"policy": policy.name, "version": policy.version})
        rows = (
            r for r in store.current_decisions(policy_name=policy.name) if r.policy_version != policy.version
        )
        active_hash = None
    else:
        policy = None
        active = store.active_trial(trial_id)
        if active is None:
            raise VerdictError(f"no trial '{trial_id}' in the audit store")
        active_hash = active.program_hash
        report = RescreenReport(trigger={"trial": trial_id, "program_hash": active_hash})
        rows = (r for r in store.current_decisions(trial_id=trial_id) if r.program_hash != active_hash)
    policies: dict[str, Policy] = {}
    for row in rows:
        item = RescreenItem(row.decision_id, row.trial_id, row.patient_id, "error", row.decision)
        report.items.append(item)
        try:
            old_program = program(row.trial_id, row.program_hash)
            new_program = program(row.trial_id, active_hash) if active_hash else old_program
            pol = policy or policies.setdefault(row.policy_name, load_policy(row.policy_name))
            if policy is not None:
                item.old_version, item.new_version = row.policy_version, pol.version
            else:
                item.old_version, item.new_version = row.program_hash, new_program.content_hash
            if not same_atoms(old_program, new_program):
                item.status, item.message = (
                    "needs_miner",
                    "the new program version's atoms differ: run the value miner",
                )
                continue
            _redecide(store, engine, row, old_program, new_program, pol, item, caller)
        except Superseded:
            item.status, item.message = "superseded", "reviewed meanwhile: the newer decision is current"
        except VerdictError as e:
            item.status, item.message = "error", e.summary
    return report


def _redecide(
    store, engine, row: DecisionRow, old_program, new_program, policy, item: RescreenItem, caller
) -> None:
    t_start = time.perf_counter()
    conflicts = conflict_atoms(row.artifacts)
    patient = rederive(
        new_program,
        stored_patient(row),
        row.policy_name,
        policy,
        conflicts=conflicts,
        reasons=policy_reasons(row.policy_name),
    )
    decision = engine.decide(new_program, patient)
    item.new = decision.decision
    if decision.decision == row.decision:
        item.status = "unchanged"
        return
    details = {
        "policy": {"name": policy.name, "from": row.policy_version, "to": policy.version},
        "program": {"from": row.program_hash, "to": new_program.content_hash},
    }
    what = (
        f"policy {policy.name} {row.policy_version} -> {policy.version}"
        if row.policy_version != policy.version
        else f"program {row.program_hash[:19]} -> {new_program.content_hash[:19]}"
    )
    lineage = Lineage(kind="rescreen", parent_id=row.decision_id, changes=[RecordedChange(
        type="rescreen", reason=f"re-screened: {what}", reviewer=caller, roles=["rescreen"], at=time.time(),
        details=details,
    )])  # fmt: skip
    successor = Successor(row, new_program, policy, patient, conflicts, lineage, caller)
    append, _ = superseding_decision(store, successor, decision, {}, t_start)
    item.new_decision_id = append().decision_id
    item.status = "changed"


def run_rescreen(
    config: str | None,
    db: str | None,
    password_env: str | None,
    *,
    policy: str | None,
    trial_id: str | None,
    out=None,
) -> tuple[str, str]:
    """`verdict match rescreen`: open the store a serve config (or --db) names, re-screen, write the
    JSON report; returns (the table for stdout, the summary line for stderr)."""

    if config is not None:
        api = load_serve_config(config).require("api")
    else:
        api = ApiConfig(audit_db=db, audit_password_env=password_env)
    store = open_store(api)
    try:
        engine = Engine(timeout_ms=api.solver_timeout_ms, alternatives=api.alternatives)
        report = rescreen(store, engine, policy=policy, trial_id=trial_id)
    finally:
        store.close()
    out = Path(out or Path("runs/match") / f"rescreen-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())) or "nothing to re-decide"
    summary = f"rescreen {json.dumps(report.trigger)}: {counts}; LLM calls: {report.llm_calls}; report {out}"
    return table_of(report), summary


def table_of(report: RescreenReport) -> str:
    """The changed decisions, old and new side by side, then the pairs that were not re-decided."""
    lines = [f"{'decision':<38} {'patient':<16} {'trial':<24} {'old':<13} {'new':<13} new decision"]
    for it in report.changed:
        lines.append(
            f"{it.decision_id:<38} {it.patient_id[:16]:<16} {it.trial_id[:24]:<24} {it.old:<13} "
            f"{it.new:<13} {it.new_decision_id}"
        )
    for it in report.items:
        if it.status in ("needs_miner", "error", "superseded"):
            lines.append(
                f"{it.decision_id:<38} {it.patient_id[:16]:<16} {it.trial_id[:24]:<24} "
                f"{it.status}: {it.message}"
            )
    return "\n".join(lines)
