"""verdict_core: the formal representation, policies and the Z3/MaxSMT decision engine.

Deterministic and LLM-free. Everything else in the project feeds it:

    program = load_program(json_text)                      # typed, checked trial program
    patient = resolve(program, "p1", mined_values, load_policy("prescreen"))
    decision = decide(program, patient)                     # d, trace, assumptions, pivotal, labels
"""

from .decision import Decision
from .errors import PatientError, PolicyError, ProgramError, VerdictError
from .patient import MinedValue, ResolvedPatient, ValueMinerOutput, load_patient
from .policy import Policy, apply_policy, load_policy, resolve
from .program import ParsedTrial, TrialProgram, load_program

__all__ = [
    "Decision",
    "MinedValue",
    "ParsedTrial",
    "PatientError",
    "Policy",
    "PolicyError",
    "ProgramError",
    "ResolvedPatient",
    "TrialProgram",
    "ValueMinerOutput",
    "VerdictError",
    "apply_policy",
    "decide",
    "check_satisfiable",
    "load_patient",
    "load_policy",
    "load_program",
    "resolve",
]


def __getattr__(name):  # the engine imports z3; load it on first use
    if name in ("decide", "check_satisfiable", "Engine"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
