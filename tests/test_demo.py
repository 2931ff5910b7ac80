"""The README's main job (`verdict demo`), end to end with real parts: the session's tiny student
and adapters (trained through train/ by the shared fixture) are reused, so the demo skips training,
starts its own vLLM + matching API, matches the sample patients over HTTP, and must agree with the
core applied to the teacher's outputs on every pair."""

import subprocess
import sys

import pytest

from tests.support import REPO, need


@pytest.mark.slow
@pytest.mark.vllm
def test_demo_runs_the_whole_story(tmp_path, student_base_dir, student_adapters):
    from tests.fixtures.vllm import vllm_available

    need(vllm_available(), "vLLM CPU environment (.venv-vllm) missing: run scripts/setup.sh")
    work = tmp_path / "demo"
    work.mkdir()
    (work / "student-base").symlink_to(student_base_dir)
    for task, adapter in student_adapters.items():  # the fixture's completed training runs
        (work / f"tiny-{task}").symlink_to(adapter.parent)
    r = subprocess.run(
        [sys.executable, "-m", "verdict", "demo", "--work", str(work)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already trained" in r.stderr  # reused, not retrained
    assert "[6/6] rationales" in r.stderr
    assert "students vs teacher: 6/6 decisions agree" in r.stdout
    assert r.stdout.count("**ELIGIBLE**") + r.stdout.count("**INELIGIBLE**") == 6
    assert "/v1/decisions/" in r.stdout
