"""The scripted server itself: rule order, per-request sequences, auto answers, its hash-only log."""

import json

import httpx
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedServer, auto_nulls
from verdict.data_gen.scripted_server import ScriptedResponse as R

from tests.support import wait_until


def post(srv, body):
    return httpx.post(srv.url + "/chat/completions", json=body, timeout=5)


def body(text, model="m", **extra):
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def test_rules_sequences_and_default(scripted_server, tmp_path):
    scripted_server.set_script(
        Script(
            rules=[
                Rule(match=Match(contains=["alpha", "beta"]), responses=[R(content="both")]),
                Rule(
                    match=Match(contains=["alpha"]),
                    responses=[R(fault="status", status=429, retry_after=2), R(content="a")],
                ),
                Rule(match=Match(model="special"), responses=[R(content={"k": 1})]),
            ]
        )
    )
    assert post(scripted_server, body("alpha beta")).json()["choices"][0]["message"]["content"] == "both"
    r = post(scripted_server, body("alpha"))
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert post(scripted_server, body("alpha")).json()["choices"][0]["message"]["content"] == "a"
    assert (
        post(scripted_server, body("alpha")).json()["choices"][0]["message"]["content"] == "a"
    )  # last repeats
    # a different request matching the same rule starts its own sequence
    assert post(scripted_server, body("alpha gamma")).status_code == 429
    assert json.loads(
        post(scripted_server, body("x", model="special")).json()["choices"][0]["message"]["content"]
    ) == {"k": 1}
    assert post(scripted_server, body("nothing matches")).status_code == 404
    assert [r.kind for r in scripted_server.requests] == [
        "ok",
        "status",
        "ok",
        "ok",
        "status",
        "ok",
        "no_match",
    ]


def test_truncated_and_usage(scripted_server):
    scripted_server.set_script(Script(default=R(content="x" * 100, fault="truncated")))
    j = post(scripted_server, body("hi")).json()
    assert j["choices"][0]["finish_reason"] == "length" and len(j["choices"][0]["message"]["content"]) == 50
    assert (
        j["usage"]["completion_tokens"] > 0 and j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + 13
    )


def test_auto_nulls_read_the_schema():
    schema = {
        "$defs": {"MinedValue": {"properties": {"atom": {"type": "string", "enum": ["a", "b"]}, "value": {}}}}
    }
    b = body("x", response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert auto_nulls(b) == {
        "values": [{"atom": "a", "value": None, "evidence": ""}, {"atom": "b", "value": None, "evidence": ""}]
    }
    assert auto_nulls(body("x", structured_outputs={"json": schema}))["values"][1]["atom"] == "b"


def test_auto_values_answer_only_the_atoms_a_request_asks(scripted_server):
    scripted_server.set_script(
        Script(
            default=R(
                auto="nulls",
                auto_values={"b": {"value": 3, "evidence": "b is 3"}, "z": {"value": True, "evidence": "z"}},
            )
        )
    )
    schema = {"properties": {"atom": {"type": "string", "enum": ["a", "b"]}, "value": {}}}
    b = body("x", response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    content = json.loads(post(scripted_server, b).json()["choices"][0]["message"]["content"])
    assert content == {
        "values": [
            {"atom": "a", "value": None, "evidence": ""},
            {"atom": "b", "value": 3, "evidence": "b is 3"},
        ]
    }  # z is not asked


def test_an_atom_with_several_lines_answers_the_one_its_note_shows(scripted_server):
    """A script for many patients: each atom lists one line per patient; with quoted_in "note" only the
    note the prompt quotes counts as shown, never the atom list beside it."""
    lines = [{"value": 70, "evidence": "aged 70"}, {"value": 45, "evidence": "45-year-old"}]
    schema = {"properties": {"atom": {"type": "string", "enum": ["age"]}, "value": {}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}

    def answer(text, quoted_in):
        scripted_server.set_script(
            Script(
                default=R(auto="sparse", auto_values={"age": lines}, only_quoted=True, quoted_in=quoted_in)
            )
        )
        content = post(scripted_server, body(text, response_format=fmt)).json()["choices"][0]["message"]
        return json.loads(content["content"])["values"]

    note = 'Patient note:\n"""\nA 45-year-old man.\n"""\nAtoms: age (e.g. aged 70)'
    assert answer(note, "note") == [{"atom": "age", "value": 45, "evidence": "45-year-old"}]
    # the whole request: "aged 70" in the atom list is shown too, and the first shown line wins
    assert answer(note, "request") == [{"atom": "age", "value": 70, "evidence": "aged 70"}]
    assert answer('Patient note:\n"""\nA man.\n"""\nAtoms: age', "note") == []


def test_log_holds_hashes_not_content(tmp_path):
    log = tmp_path / "server.log"
    with ScriptedServer(Script(default=R(content="ok")), log_path=log) as srv:
        post(srv, body("A 58-year-old woman with chest pain"))
        # the line is written once the answer has gone out; stopping does not wait for it
        wait_until(log.read_text, "the request's log line")
    line = json.loads(log.read_text())
    assert (
        set(line) == {"i", "key", "id", "model", "rule", "kind", "t", "dt"} and "chest" not in log.read_text()
    )


def test_shipped_demo_script_is_valid():
    from tests.support import REPO

    script = Script.load(REPO / "examples" / "teacher" / "scripted-demo.yaml")
    assert script.rules and script.default.auto == "nulls"
