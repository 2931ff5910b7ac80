"""`verdict fhir load`: per-patient summary, JSONL records, clear errors."""

import json
import subprocess
import sys
from pathlib import Path

from tests.fixtures.fhir_server.data import topic_resources, write_bundle


def verdict(*args):
    return subprocess.run(
        [str(Path(sys.executable).parent / "verdict"), *args], capture_output=True, text=True, timeout=120
    )


def test_load_prints_and_writes_jsonl(fhir_topics, tmp_path):
    bundle = write_bundle(tmp_path / "b.json", topic_resources(["trec-202129", "trec-202124"]))
    r = verdict(
        "fhir",
        "load",
        str(bundle),
        "--at",
        "2024-05-01",
        "--patient",
        "trec-202129",
        "--out",
        str(tmp_path / "out.jsonl"),
    )
    assert r.returncode == 0, r.stderr
    assert (
        "Patient/trec-202129: age 24 at 2024-05-01, gender male; 1 documents, 2 facts, 1 conversions"
        in r.stdout
    )
    assert "converted: 0.9004 mg/dL (molar mass 113.12 g/mol)" in r.stdout
    assert "A1c" not in r.stdout  # no note text on the console
    (line,) = (tmp_path / "out.jsonl").read_text().splitlines()
    assert json.loads(line)["documents"][0]["id"] == "DocumentReference/doc-trec-202129"


def test_bad_date_and_source_are_one_line_errors(tmp_path):
    r = verdict("fhir", "load", str(tmp_path), "--at", "01/05/2024")
    assert r.returncode == 2 and "--at: '01/05/2024' is not a date YYYY-MM-DD" in r.stderr
    r = verdict("fhir", "load", str(tmp_path / "nope.json"), "--at", "2024-05-01")
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_missing_fhir_models_name_the_extra():
    from verdict.cli import missing_dependency

    message = missing_dependency(ModuleNotFoundError("No module named 'fhir'", name="fhir"), "fhir", "fhir")
    assert "needs the 'fhir' extra: package 'fhir.resources'" in message
