"""`verdict screen --write-back`: a recorded screening run's ResearchSubjects onto the FHIR server.

The service builds them from the run's recorded decisions and gives them to an admin key only
(`GET /v1/screenings/{id}/research-subjects`: 403 for any other role, before anything is written).
Each is written through the project's one FHIR REST client (egress allowlist, SMART Backend Services
or a bearer token from $VERDICT_FHIR_TOKEN, timeouts) as a conditional update keyed on its pair
identifier: a pair screened again updates its one ResearchSubject (to the newer decision) instead of
adding a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verdict.core.cli_errors import fail
from verdict.core.errors import VerdictError

from .research_subjects import PAIR, absolute_links

if TYPE_CHECKING:
    from verdict.data_gen.fhir.rest import FhirRestConfig


@dataclass
class Written:
    created: int = 0
    updated: int = 0


def fetch_subjects(
    service_url: str, screening_id: str, key: str, timeout: float, target: str = "the FHIR server"
) -> list[dict]:
    """The run's ResearchSubjects from the service; a key without the admin role stops here, before
    anything is written to `target`."""
    import httpx  # heavy optional dependency: httpx (serve extra)

    target = f"{service_url.rstrip('/')}/v1/screenings/{screening_id}/research-subjects"
    try:
        r = httpx.get(target, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    except httpx.HTTPError as e:
        fail(f"the service at {service_url} did not answer: {type(e).__name__}")
    if r.status_code == 403:
        fail(
            "writing results back needs an API key with the admin role (`verdict serve keys add --role "
            f"admin`); nothing was written to {target} (screening {screening_id} is recorded)"
        )
    if r.status_code != 200:
        fail(f"HTTP {r.status_code} asking the service for the ResearchSubjects of screening {screening_id}")
    # links the service left relative (no api.public_url): on the URL this command was given
    return [absolute_links(rs, service_url) for rs in r.json()["research_subjects"]]


def write_subjects(fhir_server: str, subjects: list[dict], rest: FhirRestConfig | None = None) -> Written:
    """Create or update each ResearchSubject on the FHIR server (conditional update on its pair), with
    the REST client config the patients were read with (`--fhir-config`: SMART, timeouts)."""
    # heavy optional dependency: the FHIR REST client: httpx (fhir extra)
    from verdict.data_gen.fhir.rest import FhirRestClient, FhirRestConfig

    done = Written()
    try:
        cfg = rest or FhirRestConfig(base_url=fhir_server)
        with FhirRestClient(cfg) as client:  # allowlist checked first
            for rs in subjects:
                pair = next(i["value"] for i in rs["identifier"] if i.get("system") == PAIR)
                created, _ = client.put_conditional(rs, PAIR, pair)
                if created:
                    done.created += 1
                else:
                    done.updated += 1
    except VerdictError as e:  # EgressRefused or FhirServerError: says what was refused
        fail(f"write-back stopped after {done.created + done.updated} of {len(subjects)}: {e}")
    return done
