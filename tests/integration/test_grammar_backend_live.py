"""A request's grammar backend on the live server (the shared `default_server`, auto by default: a
small constraint on xgrammar):
the one named serves it and the answer says so, over gRPC and HTTP; an unknown one is refused,
naming the field."""
from __future__ import annotations

import re

import grpc
import httpx
import pytest

from live_server import chat, error_of, field_violations
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow

CODE = r"[A-Z]{3}-[0-9]{2}"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.mark.parametrize("asked, served", [
    (pb.GRAMMAR_BACKEND_LLGUIDANCE, pb.GRAMMAR_BACKEND_LLGUIDANCE),
    (pb.GRAMMAR_BACKEND_XGRAMMAR, pb.GRAMMAR_BACKEND_XGRAMMAR),
    (None, pb.GRAMMAR_BACKEND_XGRAMMAR),  # the server's default, auto: a small regex on xgrammar
])
def test_grpc_request_is_served_by_the_backend_it_names(server, asked, served):
    constraint = {"regex": CODE} if asked is None else {"regex": CODE, "grammar_backend": asked}
    request = chat("Write a product code.", max_tokens=10, temperature=0, constraint=constraint)
    response = server.stub.Generate(request, timeout=120)
    assert re.fullmatch(CODE, response.text), response.text
    assert response.grammar_backend == served
    last = list(server.stub.GenerateStream(request, timeout=120))[-1]
    assert last.grammar_backend == served


def test_validate_constraint_reports_the_backend_that_compiled_it(server):
    constraint = pb.Constraint(json_schema_text='{"type": "object", "properties": {"n": {"type": "integer"}}}',
                               grammar_backend=pb.GRAMMAR_BACKEND_LLGUIDANCE)
    report = server.stub.ValidateConstraint(pb.ValidateConstraintRequest(constraint=constraint), timeout=120)
    assert report.ok and report.grammar_backend == pb.GRAMMAR_BACKEND_LLGUIDANCE


def test_grpc_unknown_backend_is_invalid_argument_naming_the_field(server):
    request = chat("x", max_tokens=4, constraint={"regex": "a", "grammar_backend": 9})
    error = error_of(server.stub.Generate, request, timeout=30)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "constraint.grammar_backend" in field_violations(error), error.details()


def test_http_request_is_served_by_the_backend_it_names(server):
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Write a product code."}], "max_tokens": 10, "temperature": 0,
        "structured_outputs": {"regex": CODE}, "formwork": {"grammar_backend": "llguidance"}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert re.fullmatch(CODE, body["choices"][0]["message"]["content"])
    assert body["formwork"]["choices"][0]["grammar_backend"] == "llguidance"


def test_http_unknown_backend_is_a_400_naming_the_field(server):
    answer = httpx.post(f"{server.http_url}/v1/completions", timeout=60, json={
        "prompt": "x", "max_tokens": 4, "guided_regex": "a", "formwork": {"grammar_backend": "guidance"}})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "formwork.grammar_backend" and "'guidance'" in error["message"]
