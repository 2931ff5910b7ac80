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


# What a formalizer decodes under (vLLM structured outputs, xgrammar): the same models in grammar form.
FORMALIZER_SCHEMAS = ("parsed-trial", "parsed-criterion", "value-miner")
# The longest name or id a formalizer may write under a grammar. A name's length bound goes into its
# pattern (vLLM refuses a pattern combined with maxLength), so a model cannot loop inside a name
# until max_tokens. 128, not MAX_NAME: xgrammar 0.2.8's cached compiler (vLLM's) fails on bounded
# repeats above {0,127} in this recursive schema; at 128 the parser schema compiles in ~2 s once.
GRAMMAR_MAX_NAME = 128


def json_schema(name: str) -> dict:
    model = SCHEMAS[name]
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return grammar_form(schema) if name in FORMALIZER_SCHEMAS else schema


def grammar_form(node):
    """Each `{pattern: ^[..][..]*$, maxLength: n}` string as one bounded pattern of at most
    min(n, GRAMMAR_MAX_NAME) characters."""
    if isinstance(node, list):
        return [grammar_form(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: grammar_form(v) for k, v in node.items()}
    pattern, most = out.get("pattern"), out.get("maxLength")
    if isinstance(pattern, str) and isinstance(most, int) and pattern.endswith("]*$"):
        del out["maxLength"]
        out["pattern"] = pattern[:-2] + f"{{0,{min(most, GRAMMAR_MAX_NAME) - 1}}}$"
    return out
