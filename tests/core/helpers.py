"""Small hand-written programs shared by the core tests."""

from verdict.core.patient import MinedValue
from verdict.core.policy import load_policy, resolve
from verdict.core.program import load_program


def atom(name, domain="bool", kind="diagnosis", **kw):
    return {"name": name, "domain": domain, "kind": kind, "definition": f"the patient has {name}", **kw}


def program(inclusion, exclusion=(), atoms=None, definitions=(), trial_id="T1", cohorts=None):
    names = atoms or [atom(n) for n in sorted({"a", "b", "c"})]
    body = {
        "trial_id": trial_id,
        "atoms": names,
        "definitions": list(definitions),
        "cohorts": cohorts
        or [
            {
                "id": "main",
                "inclusion": [
                    {"id": f"inc{i}", "text": f"inclusion {i}", "formula": f} for i, f in enumerate(inclusion)
                ],
                "exclusion": [
                    {"id": f"exc{i}", "text": f"exclusion {i}", "formula": f} for i, f in enumerate(exclusion)
                ],
            }
        ],
    }
    return load_program(body)


def patient(prog, policy="prescreen", **values):
    mined = [MinedValue(atom=k, value=v, evidence=f"{k} is {v}") for k, v in values.items()]
    return resolve(prog, "p1", mined, load_policy(policy))
