"""JSON Schemas of the core's models: the contract for formalizers (structured outputs) and
integrators. `verdict schema --out DIR` writes them; `parsed-trial` and `value-miner` are the
schemas the trial parser and the value miner decode under."""

from __future__ import annotations

from .cases import CaseFile
from .decision import Decision
from .patient import ResolvedPatient, ValueMinerOutput
from .policy import Policy
from .program import ParsedCriterion, ParsedTrial, TrialProgram

SCHEMAS = {
    "parsed-trial": ParsedTrial,
    "parsed-criterion": ParsedCriterion,
    "value-miner": ValueMinerOutput,
    "program": TrialProgram,
    "patient": ResolvedPatient,
    "decision": Decision,
    "policy": Policy,
    "case": CaseFile,
}


def json_schema(name: str) -> dict:
    model = SCHEMAS[name]
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return schema
