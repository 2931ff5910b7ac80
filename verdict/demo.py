"""`verdict demo`: the whole on-site story on a laptop-class CPU, from a fresh clone.

    1. build a tiny Qwen2 student (offline, < 1 s)
    2. turn recorded teacher outputs into SFT datasets (prompts rendered as the service sends them)
    3. train the parser and value-miner LoRA adapters through `train/` (skipped if already trained)
    4. serve base + adapters with vLLM and start the matching API in front (`verdict serve up`)
    5. match the sample patients against the sample trials over HTTP, as an EHR would
    6. print each rationale, check it against the teacher's decision, and point at the audit pages

Everything stays on loopback; nothing is fetched from a hub. A second run reuses the trained
adapters and takes about a minute (the vLLM start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer

from verdict.core.configs import shipped
from verdict.core.engine import Engine
from verdict.core.errors import VerdictError
from verdict.core.policy import load_policy, resolve
from verdict.serve import students
from verdict.serve.api_keys import KeyStore
from verdict.serve.config import load_serve_config
from verdict.serve.errors import ServeConfigError
from verdict.serve.site_paths import adapter_folder
from verdict.serve.students import teacher_programs, teacher_values

RECORDS = shipped("examples", "demo", "teacher_records.json")


def say(step: str, text: str) -> None:
    typer.echo(f"[{step}] {text}", err=True)


def prepare_students(work: Path, records: dict) -> None:
    """Steps 1-3: the tiny base and its two adapters where configs/serve/cpu-tiny.yaml expects them."""

    base = work / "student-base"
    if not (base / "config.json").exists():
        say("1/6", "building the tiny student (random Qwen2, offline)")
        students.build_student_base(base)
    else:
        say("1/6", f"tiny student already at {base}")
    say(
        "2/6",
        f"SFT datasets from {len(records['trials'])} trials x {len(records['patients'])} patients "
        "of recorded teacher outputs",
    )
    export = students.write_student_export(records, work / "export")
    for i, task in enumerate(students.TASKS):
        run = work / f"tiny-{task}"
        if run_completed(run):  # what `vllm.adapters` will serve: a completed training run
            say("3/6", f"{task} adapter already trained ({run / 'adapter'})")
            continue
        say(
            "3/6",
            f"training the {task} adapter ({students.TRAIN_STEPS[task]} LoRA steps on CPU; "
            f"{'a minute or two' if i == 0 else 'about a minute'})",
        )
        t0 = time.monotonic()
        students.train_student(
            base, students.adapter_datasets(export, task), task, work, progress=lambda m: say("3/6", f"  {m}")
        )
        say("3/6", f"  {task} adapter trained in {time.monotonic() - t0:.0f} s")


def run_completed(run: Path) -> bool:
    """A training run folder that `vllm.adapters` accepts (completed, with its adapter)."""

    try:
        return run.exists() and adapter_folder(run) == (run / "adapter").resolve()
    except ServeConfigError:
        return False


def student_overrides(work: Path) -> list[str]:
    """Keep everything of this run in the work folder (student, adapters, keys, audit store, logs)
    and let the API take a free port (the URL comes back in the ready file). Absolute: a serve config
    takes relative paths from its own root, not from where the demo runs. Adapters are the training
    run folders (`vllm.adapters` checks that each run completed)."""
    work = work.resolve()
    adapters = {task: str(work / f"tiny-{task}") for task in ("parser", "value_miner")}
    return [
        f"vllm.model={work / 'student-base'}",
        f"vllm.adapters={json.dumps(adapters)}",
        f"vllm.log_file={work / 'vllm.log'}",
        "api.port=0",
        f"api.api_keys={work / 'api_keys.json'}",
        f"api.audit_db={work / 'audit.sqlite'}",
        f"api.log_file={work / 'api.log'}",
    ]


def write_key_file(path: Path, key: str) -> None:
    """The demo's key, readable by its owner only (0600): printed as a path, never on stdout."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")


def start_service(config: str, work: Path) -> tuple[subprocess.Popen, str, str]:
    """Step 4: `verdict serve up` in the background; returns (process, API URL, API key)."""

    overrides = student_overrides(work)
    cfg = load_serve_config(config, overrides)
    key, _ = KeyStore(cfg.require("api").api_keys).add("demo", ["match", "audit"])
    write_key_file(work / "demo-api-key", key)
    say("4/6", f"API key (match + audit roles) written to {work / 'demo-api-key'} (mode 0600)")
    ready = work / "ready.json"
    ready.unlink(missing_ok=True)
    log = work / "serve-up.log"
    say("4/6", f"starting vLLM (base + parser + value_miner adapters) and the matching API; log: {log}")
    exe = Path(sys.executable).with_name("verdict")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "verdict"]
    with open(log, "w") as out:
        sets = [x for o in overrides for x in ("--set", o)]
        proc = subprocess.Popen(
            [*cmd, "serve", "up", "--config", config, *sets, "--init", "--ready-file", str(ready)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    t0, last = time.monotonic(), 0.0
    while not ready.exists():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"`verdict serve up` exited ({proc.returncode}); end of its log:\n{tail}")
        if time.monotonic() - t0 > 900:
            stop_service(proc)
            raise RuntimeError(f"the service was not ready after 15 minutes; see {log}")
        if time.monotonic() - last > 15:
            say("4/6", f"  waiting for vLLM to load ({time.monotonic() - t0:.0f} s)")
            last = time.monotonic()
        time.sleep(0.5)
    url = json.loads(ready.read_text())["url"]
    say("4/6", f"  ready after {time.monotonic() - t0:.0f} s: API {url}")
    return proc, url, key


def stop_service(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def teacher_decisions(records: dict, policy: str) -> dict[tuple[str, str], str]:
    """What the core decides from the teacher's own outputs: what the students must reproduce."""

    engine, pol, out = Engine(), load_policy(policy), {}
    for tid, program in teacher_programs(records).items():
        for p in records["patients"]:
            mined = teacher_values(program, p, "inclusion") + teacher_values(program, p, "exclusion")
            out[(tid, p["patient_id"])] = engine.decide(
                program, resolve(program, p["patient_id"], mined, pol)
            ).decision
    return out


def match_all(url: str, key: str, records: dict, policy: str) -> list[dict]:
    """Step 5: every sample patient against every sample trial through POST /v1/match."""
    import httpx  # here: heavy optional dependency, httpx (serve extra)

    results = []
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600, trust_env=False
    ) as c:
        for t in records["trials"]:
            trial = {k: t[k] for k in ("trial_id", "title", "inclusion", "exclusion") if t.get(k)}
            for p in records["patients"]:
                say("5/6", f"POST /v1/match  trial {t['trial_id']}  patient {p['patient_id']}")
                r = c.post(
                    "/v1/match",
                    json={
                        "trial": trial,
                        "policy": policy,
                        "patient": {"patient_id": p["patient_id"], "note": p["note"]},
                    },
                )
                if r.status_code != 200:
                    raise RuntimeError(f"/v1/match answered {r.status_code}: {r.text[:500]}")
                results.append(r.json())
    return results


def run_demo(
    config: str = "cpu-tiny",
    work: Path = Path("runs/demo"),
    records_path: Path = RECORDS,
    policy: str = "prescreen",
    keep_running: bool = False,
) -> int:
    work = work.resolve()  # relative to where the demo runs
    work.mkdir(parents=True, exist_ok=True)
    records = json.loads(Path(records_path).read_text())
    t0 = time.monotonic()
    prepare_students(work, records)
    expected = teacher_decisions(records, policy)
    proc, url, key = start_service(config, work)
    try:
        results = match_all(url, key, records, policy)
        say("6/6", "rationales")
        agree = 0
        for res in results:
            typer.echo("")
            typer.echo(res["rationale_markdown"])
            typer.echo(f"\n  audit page: {url}{res['links']['page']}  (decision {res['decision_id']})")
            agree += res["decision"]["decision"] == expected[(res["trial_id"], res["patient_id"])]
        typer.echo("")
        typer.echo(
            f"students vs teacher: {agree}/{len(results)} decisions agree "
            f"(the core applied to the teacher's own outputs)"
        )
        typer.echo(f"demo finished in {time.monotonic() - t0:.0f} s")
        if keep_running:
            typer.echo(
                f"the service stays up at {url} (API key in {work / 'demo-api-key'}, mode 0600); "
                "Ctrl-C to stop"
            )
            try:
                while proc.poll() is None:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0 if agree == len(results) else 1
    finally:
        stop_service(proc)


def demo(
    config: str = typer.Option("cpu-tiny", help="serve config (configs/serve) with the student paths"),
    work: Path = typer.Option(Path("runs/demo"), help="where the tiny student, datasets and adapters go"),
    records: Path = typer.Option(RECORDS, help="recorded teacher outputs to distil"),
    policy: str = typer.Option("prescreen", help="missingness policy"),
    keep_running: bool = typer.Option(False, help="leave the service up after the demo (Ctrl-C to stop)"),
) -> None:
    """The main job: tiny student -> adapters trained on recorded teacher outputs -> vLLM + matching
    API -> sample patients matched over HTTP -> rationales."""

    try:
        code = run_demo(config, work, records, policy, keep_running)
    except (VerdictError, RuntimeError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)
