"""A screen's rows as FHIR R4 `ResearchSubject`s (fhir.resources R4B models, as data_gen.fhir reads).

One per ranked pair: `study` names the `ResearchStudy` by identifier (the trial id, an NCT id on
ClinicalTrials.gov), `individual` the Patient, and two extensions point to the decision record and
its clinician page. Status: a pre-screen never enrols nor decides eligibility alone, so every
eligible pair (with or without assumptions to confirm) is a `candidate`; an ineligible one (near
misses included) is `ineligible`; an undetermined one a `potential-candidate`. Failed pairs have no
decision and get no resource.

Two identifiers: the decision id, and the pair (trial, patient), the key a write-back to a FHIR
server updates on, so that screening the pair again updates its one ResearchSubject.

The links start with the service's URL as configured (`api.public_url`, or the URL the CLI was given);
with none they are relative references (`/v1/decisions/...`), which `absolute_links` completes.
"""

from __future__ import annotations

from fhir.resources.R4B.researchsubject import ResearchSubject

CTGOV = "https://clinicaltrials.gov"
EXT_DECISION = "urn:verdict:decision"  # valueUrl: the decision record (GET, role audit)
EXT_PAGE = "urn:verdict:decision-page"  # valueUrl: its clinician page
DECISION_ID = "urn:verdict:decision-id"
PAIR = "urn:verdict:screening-pair"  # value "TRIAL PATIENT": a space is in no Verdict id
STATUS = {
    "eligible": "candidate",
    "eligible_to_confirm": "candidate",
    "near_miss": "ineligible",
    "ineligible": "ineligible",
    "undetermined": "potential-candidate",
}
DECISION_STATUS = {"eligible": "candidate", "ineligible": "ineligible", "undetermined": "potential-candidate"}


def pair_value(trial_id: str, patient_id: str) -> str:
    return f"{trial_id} {patient_id}"


def subject(
    *, decision_id: str, trial_id: str, patient_id: str, status: str, links: dict, service_url: str
) -> ResearchSubject:
    """The ResearchSubject of one decided pair; `links` are the decision's service paths."""
    base = service_url.rstrip("/")
    return ResearchSubject.model_validate(
        {
            "resourceType": "ResearchSubject",
            "id": decision_id.replace("_", "-")[:64],  # FHIR ids allow [A-Za-z0-9.-]
            "identifier": [
                {"system": DECISION_ID, "value": decision_id},
                {"system": PAIR, "value": pair_value(trial_id, patient_id)},
            ],
            "status": status,
            "study": {
                "type": "ResearchStudy",
                "display": trial_id,
                "identifier": {"system": CTGOV, "value": trial_id},
            },
            "individual": {"reference": f"Patient/{patient_id}"},
            "extension": [
                {"url": EXT_DECISION, "valueUrl": base + links["decision"]},
                {"url": EXT_PAGE, "valueUrl": base + links["page"]},
            ],
        }
    )


def absolute_links(resource: dict, service_url: str) -> dict:
    """A ResearchSubject (JSON) whose relative links are made absolute on `service_url`."""
    base = service_url.rstrip("/")
    for ext in resource.get("extension") or []:
        url = ext.get("valueUrl")
        if isinstance(url, str) and url.startswith("/"):
            ext["valueUrl"] = base + url
    return resource


def research_subject(row: dict, service_url: str) -> ResearchSubject:
    """The ResearchSubject of one `ScreenRow` (as JSON) of the service at `service_url`."""
    return subject(
        decision_id=row["decision_id"],
        trial_id=row["trial_id"],
        patient_id=row["patient_id"],
        status=STATUS[row["tier"]],
        links=row["links"],
        service_url=service_url,
    )


def research_subjects_ndjson(body: dict, service_url: str) -> str:
    """One ResearchSubject per ranked row of a `ScreenResponse` (JSON), one JSON line each."""
    return "".join(
        research_subject(r, service_url).model_dump_json(exclude_none=True) + "\n" for r in body["rows"]
    )
