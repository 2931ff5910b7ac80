"""How long reading the 75 shared TREC 2021 topics from FHIR takes, per source: a Bundle file, a Bulk
Data NDJSON folder, and the real test FHIR server (@medplum/fhir-router, in memory) over REST.

    .venv/bin/python benchmarks/fhir_load.py [--no-rest] [--page-size 100]

Printed per source: patients, documents, facts, conversions, seconds in all and per patient, and for
REST the HTTP requests made. Needs ../shared/data and, for REST, Node 20 + npm.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def report(name: str, result, seconds: float, extra: str = "") -> None:
    recs = result.records
    print(
        f"{name:7s} {len(recs):3d} patients, {sum(len(r.documents) for r in recs)} documents, "
        f"{sum(len(r.facts) for r in recs)} facts, {sum(len(r.conversions()) for r in recs)} conversions: "
        f"{seconds:.2f} s ({seconds / max(len(recs), 1) * 1000:.1f} ms/patient){extra}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-rest", action="store_true", help="skip the REST source (no Node needed)")
    ap.add_argument("--page-size", type=int, default=100, help="_count of the REST searches")
    args = ap.parse_args()
    from verdict.data_gen.fhir.rest import FhirRestConfig
    from verdict.data_gen.fhir.sources import load_source

    from tests.fixtures.fhir_server.data import AT, TOKEN, topic_resources, write_bundle, write_ndjson

    resources = topic_resources()
    if not resources:
        sys.exit("the shared TREC 2021 topics (../shared/data/benchmarks) are missing")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in (
            ("bundle", write_bundle(Path(tmp) / "b.json", resources)),
            ("ndjson", write_ndjson(Path(tmp) / "export", resources)),
        ):
            t0 = time.perf_counter()
            result = load_source(str(path), AT)
            report(name, result, time.perf_counter() - t0)
    if args.no_rest:
        return
    import os

    from tests.fixtures.fhir_server.runtime import install, start

    server = start(install(), env={"FHIR_TEST_TOKEN": TOKEN})
    try:
        for r in resources:
            server.put(r, TOKEN)
        os.environ["VERDICT_FHIR_TOKEN"] = TOKEN
        before = server.request_count()
        t0 = time.perf_counter()
        result = load_source(
            server.base_url, AT, rest=FhirRestConfig(base_url=server.base_url, page_size=args.page_size)
        )
        seconds = time.perf_counter() - t0
        report("rest", result, seconds, f", {server.request_count() - before} HTTP requests")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
