"""`verdict bench run|compare` as a user sees them: exit codes, clear errors, the comparison."""

import json
import subprocess

import pytest
from verdict.data_gen.scripted_server import ScriptedServer

from tests.support import VERDICT

from . import scenario

CLI = VERDICT


def verdict(*args, timeout=180):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The scenario under the prescreen and under the strict policy."""
    root = tmp_path_factory.mktemp("cli")
    with ScriptedServer(scenario.script()) as srv:
        cfg = scenario.write_config(root, srv.url)
        a = verdict("bench", "run", "-c", cfg, "--no-progress")
        b = verdict(
            "bench",
            "run",
            "-c",
            cfg,
            "--set",
            "name=scenario-strict",
            "--set",
            "policy=strict",
            "--no-progress",
        )
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    return root / "runs" / "scenario", root / "runs" / "scenario-strict", a


def test_run_prints_where_the_results_are(two_runs):
    a_dir, _, proc = two_runs
    assert "bench scenario: complete: 14 pair results this session" in proc.stdout
    assert f"report:  {a_dir / 'report.md'}" in proc.stdout
    assert (
        "skipped: pairs.jsonl:4" in proc.stderr and "verdict-scripted r0: 7 of 7 pairs to go" in proc.stderr
    )


def test_compare_puts_runs_side_by_side(two_runs, tmp_path):
    a_dir, b_dir, _ = two_runs
    out = tmp_path / "cmp.md"
    r = verdict("bench", "compare", a_dir, b_dir / "results.json", "--out", out)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "# `scenario` vs `scenario-strict`" in text
    assert "| A | verdict-scripted | 7 | 0.571" in text
    # strict: open inclusion atoms are not established, so P3 x DM becomes ineligible; the direct
    # matcher does not use the policy and answers the same in both runs
    rows = [x for x in text.splitlines() if x.startswith("| verdict-scripted | verdict-scripted |")]
    assert len(rows) == 1 and "| 7 | 0.857 |" in rows[0]  # P3 x DM alone changed
    same = [x for x in text.splitlines() if x.startswith("| llmmatch-scripted | llmmatch-scripted |")]
    assert "| 7 | 1.000 | 1.000 |" in same[0]
    assert out.read_text().strip() == text.strip()


def test_report_only_rewrites_outputs(two_runs):
    a_dir, _, _ = two_runs
    (a_dir / "report.md").unlink()
    cfg = a_dir / "config.yaml"
    r = verdict("bench", "run", "-c", cfg, "--report-only")
    assert r.returncode == 0, r.stderr
    assert (a_dir / "report.md").exists()
    assert (
        json.loads((a_dir / "results.json").read_text())["backends"]["verdict-scripted"]["coverage"]["run"]
        == 7
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "run", "-c", "no-such-config"], "no bench config named 'no-such-config'"),
        (["bench", "compare", ".", "."], "no results.json"),
    ],
)
def test_errors_are_one_line_without_traceback(args, message):
    r = verdict(*args)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_key_in_config_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "name: bad\ndataset: {kind: sigir, pairs: x.json, require_text: false}\n"
        "backends: [{name: r, kind: recorded}]\nrepeat: 2\n"
    )
    r = verdict("bench", "run", "-c", cfg)
    assert r.returncode == 2 and "unknown config key 'repeat' (did you mean 'repeats'?)" in r.stderr
