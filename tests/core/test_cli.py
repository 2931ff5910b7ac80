"""`verdict decide` and friends, run as a user runs them (a subprocess)."""

import json
import subprocess
import sys

from tests.support import REFERENCE_V6, REPO, VERDICT, need

VERDICT = VERDICT


def run(*args, cwd=REPO):
    return subprocess.run(VERDICT + list(args), capture_output=True, text=True, cwd=cwd, timeout=300)


def test_decide_reference_files_prints_the_interop_contract():
    files = sorted(REFERENCE_V6.glob("*/*__full.json"))[:6]
    need(bool(files), "reference corpus missing")
    r = run("decide", *map(str, files), "--policy", "prescreen", "--format", "json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == len(files)
    for line in lines:
        obj = json.loads(line)
        assert obj["decision"] in ("eligible", "ineligible", "undetermined")
        for a in obj["assumptions"]:
            assert set(a) == {"atom", "value", "class"} and a["class"] in ("forced", "alternative", "inert")
        for p in obj["pivotal"]:
            assert {"atom", "current", "target", "requirement"} <= set(p)
            if obj["decision"] == "eligible" and p["action"] == "confirm":
                assert p["current"] is None
        assert obj["pivotal"], "every decided reference pair has a pivot"


def test_decide_project_cases_and_markdown():
    cases = sorted((REPO / "examples" / "cases").glob("*.json"))
    r = run("decide", *map(str, cases), "--format", "md")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n## ") + r.stdout.startswith("## ") == len(cases)
    assert "To confirm at the screening visit" in r.stdout


def test_bad_input_gets_a_clear_error_and_other_files_still_run(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    good = REPO / "examples" / "cases" / "01_t2d_eligible.json"
    r = run("decide", str(bad), str(tmp_path / "missing.json"), str(good))
    assert r.returncode == 1
    assert "error:" in r.stderr and "bad.json" in r.stderr and "missing.json" in r.stderr
    assert "Traceback" not in r.stderr
    bad_out, missing_out, good_out = map(json.loads, r.stdout.strip().splitlines())  # one line per file
    assert bad_out["source"].endswith("bad.json") and bad_out["error"] == "VerdictError"
    assert missing_out["error"] == "ReadError" and set(missing_out) == {
        "source",
        "error",
        "message",
        "problems",
    }
    assert good_out["decision"] == "eligible"
    r = run("decide", str(good), "--policy", "nope")
    assert r.returncode == 2 and "no policies config named 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_schema_export(tmp_path):
    r = run("schema", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "parsed-trial.schema.json").read_text())["type"] == "object"
    r = run("schema", "nope")
    assert r.returncode == 2 and "unknown schema" in r.stderr


def test_samples_prints_rationales():
    r = run("samples")
    assert r.returncode == 0, r.stderr
    assert "**ELIGIBLE**" in r.stdout and "**INELIGIBLE**" in r.stdout


def test_decision_output_is_byte_for_byte_reproducible_across_processes():
    files = sorted(REFERENCE_V6.glob("*/*__full.json"))[::5]
    need(bool(files), "reference corpus missing")
    runs = [run("decide", *map(str, files), "--format", "full-json") for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.count("\n") == len(files)


HELDOUT = REPO / "tests" / "core" / "data" / "heldout"


def test_held_out_batch_decides_file_by_file_with_an_error_line_where_one_fails():
    """An unsupported construct in one file (an existential inside a criterion) is that file's
    error object; every other file, before and after it, is decided; exit status 1 at the end."""
    files = sorted(HELDOUT.glob("*/*__full.json"))
    assert len(files) == 6
    r = run("decide", *map(str, files), "--format", "json", "--summary")
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert r.stderr.splitlines()[-1] == (
        "files 6, decided 5 (eligible 2, ineligible 3), errors 1 "
        "(UnsupportedConstructError 1), conflicts reported 2 (passes 1, threshold_helpers 1)"
    )
    lines = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [line["source"] for line in lines] == [str(f) for f in files]
    by_stem = {f.name.split("__")[0]: line for f, line in zip(files, lines)}
    failed = by_stem.pop("NCT90000002")
    assert failed["error"] == "UnsupportedConstructError"
    assert failed["problems"] == [
        "inclusion side, assertion REQ0_COMPONENT0_CREATININE: 'exists' quantifier in a criterion"
    ]
    assert all(line["decision"] in ("eligible", "ineligible") for line in by_stem.values())
    # the existential definition is imported faithfully: creatinine 2.6 fails "renal function adequate"
    assert by_stem["NCT90000001"]["decision"] == "ineligible"
    # contradictory threshold helpers and incompatible passes are reported, with the values
    (thresh,) = by_stem["NCT90000003"]["conflicts"]
    assert thresh["source"] == "threshold_helpers" and len(thresh["values"]) == 2
    (passes,) = by_stem["NCT90000004b"]["conflicts"]
    assert passes["source"] == "passes" and any(v.startswith("exclusion pass:") for v in passes["values"])
    assert any("recorded by the exclusion pass only" in n for n in by_stem["NCT90000004a"]["import_notes"])
    # a program no patient can satisfy says so, instead of "MaxSMT did not finish"
    nobody = by_stem["NCT90000005"]
    assert nobody["reason"].startswith("the trial program admits no patient") and not nobody["incomplete"]


def test_held_out_markdown_shows_conflicts_notes_and_errors():
    files = sorted(HELDOUT.glob("*/*__full.json"))
    r = run("decide", *map(str, files), "--format", "md")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stdout.count("## ") >= len(files)
    assert "**ERROR** (UnsupportedConstructError)" in r.stdout
    assert "the recorded threshold helpers contradict each other" in r.stdout
    assert "### Import notes" in r.stdout


# `verdict` with one module made unimportable, as on a machine where it is not installed.
BLOCKED = """
import sys
BLOCK = sys.argv.pop(1)
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == BLOCK or name.startswith(BLOCK + "."):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
sys.meta_path.insert(0, Block())
from verdict.cli import main
main()
"""


def run_without(module, *args):
    return subprocess.run(
        [sys.executable, "-c", BLOCKED, module, *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_a_missing_extra_is_an_error_naming_the_package_and_the_extra():
    r = run_without("jinja2", "slurm", "render", "-t", "parser", "-s", "local")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "`verdict slurm` needs the 'slurm' extra: package 'jinja2'" in r.stderr
    assert "pip install 'verdict-onsite[slurm]'" in r.stderr


def test_a_broken_transitive_import_is_named_as_a_broken_environment():
    r = run_without("markupsafe", "slurm", "render", "-t", "parser", "-s", "local")  # jinja2's own dependency
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "module 'markupsafe' is missing, a package none of the project's extras declares" in r.stderr


def test_a_part_that_cannot_load_stays_listed_and_says_why():
    r = run_without("verdict.bench.cli", "--help")
    assert r.returncode == 0 and "UNAVAILABLE" in r.stdout and "bench" in r.stdout
    r = run_without("verdict.bench.cli", "bench", "core", "--repeats", "1")
    assert r.returncode == 2 and "No such command" not in r.stderr
    assert (
        "`verdict bench` cannot load: module 'verdict.bench.cli' is missing, a module of this project"
        in r.stderr
    )
    assert run_without("verdict.bench.cli", "policies").returncode == 0  # the rest of verdict still works


def test_version_names_the_installed_package_and_the_code():
    from importlib import metadata

    r = subprocess.run(
        [sys.executable, "-c", "from verdict.cli import main; main()", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"verdict-onsite {metadata.version('verdict-onsite')} (")
    assert "git:" in r.stdout or "package:" in r.stdout
