"""The Python client (clients/python, package formwork_client): packaging and request building
offline, then the sync client, the asyncio client and the CLI against one live server."""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import tomllib
import zipfile

import grpc
import jsonschema
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import formwork_client as fc
from formwork_client.request import extract_prompt, extract_request, generate_request
from live_server import EXTRACT_PERSON_SCHEMA as PERSON_SCHEMA, REPO_ROOT, LiveServer
from rpc_fakes import FakeRpcError
from service import protogen

CLIENT_DIR = REPO_ROOT / "clients" / "python"
CLI = [sys.executable, "-m", "formwork_client.cli"]

TEXT = "Ada Lovelace was 36 years old."


@contextlib.contextmanager
def unserved_address():
    """An address where nothing listens: the socket stays bound (never listening) while it is used,
    so no other process can take the port meanwhile; connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


# ---- packaging --------------------------------------------------------------------------------


def test_client_stubs_are_fresh():
    assert protogen.stale_files(protogen.CLIENT) == [], "run `make proto` (python -m service.protogen)"


def test_client_imports_no_server_code():
    blocker = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"service", "engine", "grammar", "bench", "torch", "xgrammar"}:
            raise ImportError(f"formwork_client imported {name}")
sys.meta_path.insert(0, Block())
import formwork_client, formwork_client.cli, formwork_client.aio
"""
    result = subprocess.run([sys.executable, "-c", blocker], cwd=CLIENT_DIR, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_package_needs_only_grpcio_protobuf_and_status_protos(tmp_path):
    project = tomllib.loads((CLIENT_DIR / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].strip() for dep in project["dependencies"]}
    assert names == {"grpcio", "protobuf", "googleapis-common-protos"}
    assert project["scripts"] == {"formwork-client": "formwork_client.cli:main"}
    # the wheel carries the generated stubs (they are not in the repository's proto/ path)
    # offline when this environment has setuptools (Python <= 3.11 venvs do); else pip fetches it
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(tmp_path),
                    str(CLIENT_DIR)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("formwork_client-*.whl")
    members = set(zipfile.ZipFile(wheel).namelist())
    assert {"formwork_client/_gen/formwork/v1/generation_pb2.py", "formwork_client/_gen/formwork/v1/generation_pb2_grpc.py",
            "formwork_client/_gen/formwork/v1/generation_pb2.pyi", "formwork_client/py.typed"} <= members
    assert not any(m.startswith(("service/", "engine/", "grammar/")) for m in members)


# ---- offline: requests and errors ------------------------------------------------------------


def test_unset_sampling_fields_stay_unset_and_zero_is_sent():
    request = generate_request("hi")
    assert not request.HasField("max_tokens") and not request.HasField("temperature")
    request = generate_request("hi", max_tokens=0, temperature=0.0, ignore_eos=False)
    assert request.HasField("max_tokens") and request.HasField("temperature") and request.HasField("ignore_eos")


def test_min_tokens_is_sent_only_when_given():
    assert not generate_request("hi").HasField("min_tokens")
    assert generate_request("hi", min_tokens=0).HasField("min_tokens")
    assert generate_request("hi", min_tokens=5).min_tokens == 5


def test_speculative_is_sent_only_when_given():
    assert not generate_request("hi").HasField("speculative")
    off = generate_request("hi", speculative=False)
    assert off.HasField("speculative") and not off.speculative
    assert extract_request(PERSON_SCHEMA, "Some text.", speculative=True).speculative
    assert not extract_request(PERSON_SCHEMA, "Some text.").HasField("speculative")


def test_inputs_and_constraints():
    chat = generate_request(messages=[{"role": "user", "content": "x"}], add_generation_prompt=False)
    assert chat.WhichOneof("input") == "chat" and chat.chat.HasField("add_generation_prompt")
    assert list(generate_request(prompt_token_ids=[1, 2]).prompt_token_ids.ids) == [1, 2]
    with pytest.raises(TypeError, match="exactly one of prompt, messages or prompt_token_ids"):
        generate_request("a", messages=[])
    with pytest.raises(TypeError, match="exactly one"):
        generate_request()
    # a dict is a JSON Schema sent as text: property order kept
    request = generate_request("x", constraint={"type": "object", "properties": {"z": {}, "a": {}}})
    assert request.constraint.json_schema_text == '{"type": "object", "properties": {"z": {}, "a": {}}}'
    assert not request.constraint.HasField("strict")
    assert fc.json_schema({}, strict=False).HasField("strict")
    assert fc.choice(["a", "b"]).choice.choices == ["a", "b"]
    with pytest.raises(TypeError, match="list of strings"):
        fc.choice("ab")


def test_grammar_backend_is_sent_only_when_given():
    assert not fc.regex("a").HasField("grammar_backend")
    assert fc.regex("a", grammar_backend="llguidance").grammar_backend == fc.pb.GRAMMAR_BACKEND_LLGUIDANCE
    assert fc.json_schema({}, grammar_backend="auto").grammar_backend == fc.pb.GRAMMAR_BACKEND_AUTO
    assert fc.json_object(grammar_backend="xgrammar").grammar_backend == fc.pb.GRAMMAR_BACKEND_XGRAMMAR
    assert fc.grammar('root ::= "a"', grammar_backend="llguidance").HasField("grammar_backend")
    assert fc.choice(["a"], grammar_backend="llguidance").HasField("grammar_backend")
    with pytest.raises(ValueError, match="grammar_backend must be one of auto, xgrammar, llguidance"):
        fc.regex("a", grammar_backend="guidance")


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}


def test_tools_tool_choice_and_messages_with_calls():
    request = generate_request(messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 C"}],
        tools=[WEATHER_TOOL, {"name": "get_time"}], tool_choice="get_weather", parallel_tool_calls=False,
        reasoning=False, reasoning_budget=16)
    assert [t.name for t in request.tools] == ["get_weather", "get_time"]
    assert json.loads(request.tools[0].parameters_json) == WEATHER_TOOL["function"]["parameters"]
    assert request.tools[1].parameters_json == ""
    assert request.tool_choice.function_name == "get_weather" and request.parallel_tool_calls is False
    assert request.reasoning.enabled is False and request.reasoning.budget_tokens == 16
    thinking = generate_request(messages=[{"role": "user", "content": "hi"}], reasoning_format=fc.regex(r"\d+\."))
    assert thinking.reasoning.think_constraint.regex == r"\d+\." and not thinking.HasField("constraint")
    call = request.chat.messages[1].tool_calls[0]
    assert (call.id, call.name, call.arguments_json) == ("call_1", "get_weather", '{"city": "Oslo"}')
    assert request.chat.messages[2].tool_call_id == "call_1"
    assert generate_request("x", tool_choice="required").tool_choice.mode == fc.pb.TOOL_CHOICE_MODE_REQUIRED
    named = generate_request("x", tool_choice={"type": "function", "function": {"name": "f"}})
    assert named.tool_choice.function_name == "f"
    with pytest.raises(TypeError, match="a tool is"):
        generate_request("x", tools=[{"type": "retrieval"}])


def test_extract_request():
    request = extract_request(PERSON_SCHEMA, "Some text.", max_tokens=8)
    (message,) = request.chat.messages
    assert message.role == "user" and message.content == "Some text.\n\nExtract name, age from this text as JSON."
    assert request.temperature == 0 and request.max_tokens == 8
    assert json.loads(request.constraint.json_schema_text) == PERSON_SCHEMA
    assert extract_prompt('{"type": "string"}', "x") == "x\n\nExtract the information from this text as JSON."
    assert extract_prompt(True, "x", "Find it.") == "x\n\nFind it."


@pytest.mark.skipif(not (REPO_ROOT / "clients" / "node" / "node_modules").is_dir(),
                    reason="the Node client's packages are not installed (make node-deps; make test does it)")
def test_extract_prompt_is_the_same_in_node():
    cases = [[PERSON_SCHEMA, "Ada was 36.", None], ['{"type": "object", "properties": {"b": {}, "a": {}}}', "t", None],
             [{"type": "array"}, "t", None], [PERSON_SCHEMA, "t", "Only the first person."]]
    script = ('import { extractPrompt } from "formwork-client";\n'
              'const cases = JSON.parse(process.argv[1]);\n'
              'console.log(JSON.stringify(cases.map(([s, t, i]) => extractPrompt(s, t, i ?? undefined))));')
    result = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps(cases)],
                            cwd=REPO_ROOT / "clients" / "node", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [extract_prompt(*case) for case in cases]


@pytest.mark.parametrize("code, cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, fc.InvalidArgumentError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, fc.ResourceExhaustedError),
    (grpc.StatusCode.UNAVAILABLE, fc.UnavailableError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, fc.DeadlineExceededError),
    (grpc.StatusCode.CANCELLED, fc.RequestCancelledError),
    (grpc.StatusCode.INTERNAL, fc.InternalError),
    (grpc.StatusCode.UNIMPLEMENTED, fc.StatusError),
])
def test_every_status_code_has_its_exception(code, cls):
    error = fc.errors.from_rpc_error(FakeRpcError(code, "the server's words"))
    assert type(error) is cls and error.code is code and error.message == "the server's words"
    assert str(error) == f"{code.name}: the server's words" and error.field_violations == ()


@pytest.mark.parametrize("details", [
    "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))",  # grpc core (Python), from Envoy
    "Received RST_STREAM with error code 0",
    "Received RST_STREAM with code 2 (Internal server error)"])  # grpc-js
def test_a_stream_reset_without_a_status_is_unavailable_in_both_clients(details):
    # what a proxy sends when the replica behind it died after the first output (tests/integration/test_cluster.py)
    error = fc.errors.from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL, details))
    assert type(error) is fc.UnavailableError and error.code is grpc.StatusCode.UNAVAILABLE
    assert error.message.endswith(details) and "went away" in error.message
    script = ('import grpc from "@grpc/grpc-js";\n'
              'import { fromServiceError } from "./src/errors.js";\n'
              'const codes = [grpc.status.INTERNAL, grpc.status.UNKNOWN];\n'
              'console.log(JSON.stringify(codes.map((code) => {\n'
              '  const e = fromServiceError({ code, details: process.argv[1] });\n'
              '  return [e.code, e.details];\n'
              '})));')
    result = subprocess.run(["node", "--input-type=module", "-e", script, details],
                            cwd=REPO_ROOT / "clients" / "node", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (node_code, node_message), unknown = json.loads(result.stdout)
    assert node_code == "UNAVAILABLE" and node_message == error.message
    assert unknown == ["UNKNOWN", details]  # only INTERNAL resets are read this way


def test_field_violations_come_from_the_status_details():
    bad_request = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="top_p", description="must be in (0, 1], got 2")])
    detail = any_pb2.Any()
    detail.Pack(bad_request)
    status = status_pb2.Status(code=3, message="top_p: must be in (0, 1], got 2", details=[detail])
    trailers = (("other", "x"), ("grpc-status-details-bin", status.SerializeToString()))
    error = fc.errors.from_rpc_error(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, status.message, trailers))
    assert error.field_violations == (fc.FieldViolation("top_p", "must be in (0, 1], got 2"),)


def test_cli_usage_errors_exit_2():
    with unserved_address() as address:
        result = subprocess.run([*CLI, "--address", address, "generate", "--prompt", "x", "--regex", "a",
                                 "--choice", "b"], capture_output=True, text=True)
    assert result.returncode == 2 and "give at most one constraint" in result.stderr, result.stderr


# ---- live: the sync client ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def client(server):
    with fc.Client(server.address, timeout=120) as client:
        yield client


@pytest.mark.slow
def test_extract_returns_a_dict_the_schema_accepts(client):
    person = client.extract(PERSON_SCHEMA, TEXT, max_tokens=40)
    assert isinstance(person, dict)
    jsonschema.validate(person, PERSON_SCHEMA)


@pytest.mark.slow
def test_generate_with_a_constraint_and_tokenize(client):
    messages = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    response = client.generate(messages=messages, max_tokens=4, temperature=0, constraint=fc.choice(["yes", "no"]))
    assert response.text in ("yes", "no") and response.finish_reason == fc.pb.FINISH_REASON_STOP
    assert len(client.tokenize(messages=messages).token_ids) == response.usage.prompt_tokens


@pytest.mark.slow
def test_tools_a_required_call_streamed_and_tokenized(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    fields = dict(messages=messages, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False,
                  max_tokens=48, temperature=0)
    response = client.generate(**fields)
    [call] = response.tool_calls
    assert call.name == "get_weather" and response.content == ""
    jsonschema.validate(json.loads(call.arguments_json), WEATHER_TOOL["function"]["parameters"])
    streamed = list(client.stream(**fields))
    deltas = [d for m in streamed for d in m.tool_call_deltas]
    assert deltas[0].name == "get_weather" and deltas[0].id == streamed[-1].tool_calls[0].id
    assert "".join(d.arguments_delta for d in deltas) == streamed[-1].tool_calls[0].arguments_json
    tokenized = client.tokenize(messages=messages, tools=[WEATHER_TOOL])
    assert len(tokenized.token_ids) == response.usage.prompt_tokens > len(client.tokenize(messages=messages).token_ids)


@pytest.mark.slow
def test_min_tokens_holds_off_a_stop_string(client):
    fields = dict(prompt="Count: one, two, three,", max_tokens=16, temperature=0, stop=[","])
    assert client.generate(**fields).usage.completion_tokens < 6  # the stop string ends it early
    response = client.generate(**fields, min_tokens=6)
    assert response.usage.completion_tokens >= 6 and response.finish_reason == fc.pb.FINISH_REASON_STOP


@pytest.mark.slow
def test_stream_adds_up(client):
    messages = list(client.stream("The three primary colors are", max_tokens=6, temperature=0))
    assert len(messages) > 1 and all(m.finish_reason == fc.pb.FINISH_REASON_UNSPECIFIED for m in messages[:-1])
    assert messages[-1].usage.completion_tokens == sum(len(m.token_ids) for m in messages)


@pytest.mark.slow
def test_leaving_a_stream_early_cancels_the_request(server, client):
    stream = client.stream("Count: one, two,", max_tokens=200, ignore_eos=True)
    next(stream)
    stream.close()
    load = server.wait_idle()
    assert load.num_in_flight == load.num_running == 0


@pytest.mark.slow
def test_validate_constraint_and_model_info(client):
    assert client.validate_constraint(fc.regex("[A-Z]{3}-[0-9]{4}")).ok
    bad = client.validate_constraint({"type": "array", "uniqueItems": True})
    assert not bad.ok and "uniqueItems" in bad.error
    best_effort = client.validate_constraint(fc.json_schema({"type": "array", "uniqueItems": True}, strict=False))
    assert best_effort.ok and any("uniqueItems" in entry for entry in best_effort.not_enforced)
    info = client.model_info()
    assert info.model_name == "SmolLM2-135M-Instruct" and "json_schema" in info.constraint_kinds


@pytest.mark.slow
def test_grammar_backend_serves_the_request_and_is_reported(client):
    constraint = fc.regex("[A-Z]{3}", grammar_backend="llguidance")
    assert client.validate_constraint(constraint).grammar_backend == fc.pb.GRAMMAR_BACKEND_LLGUIDANCE
    response = client.generate("Code:", max_tokens=4, temperature=0, constraint=constraint)
    assert len(response.text) == 3 and response.grammar_backend == fc.pb.GRAMMAR_BACKEND_LLGUIDANCE


@pytest.mark.slow
def test_invalid_argument_names_the_field(client):
    with pytest.raises(fc.InvalidArgumentError) as info:
        client.generate("hi", max_tokens=0)
    assert info.value.message == "max_tokens: must be >= 1, got 0"
    assert info.value.field_violations == (fc.FieldViolation("max_tokens", "must be >= 1, got 0"),)


@pytest.mark.slow
def test_an_unenforceable_schema_is_invalid_argument_unless_best_effort(client):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                        "maxItems": 2, "uniqueItems": True}},
              "required": ["tags"], "additionalProperties": False}
    with pytest.raises(fc.InvalidArgumentError) as info:
        client.extract(schema, "Tags: red, blue.", max_tokens=32)
    assert 'unsupported keyword "uniqueItems" at /properties/tags' in info.value.message
    assert [v.field for v in info.value.field_violations] == ["constraint.json_schema_text"]
    response = client.generate(messages=[{"role": "user", "content": "Tags: red, blue."}], max_tokens=32,
                               temperature=0, constraint=fc.json_schema(schema, strict=False))
    assert response.not_enforced == ["uniqueItems at /properties/tags"]


@pytest.mark.slow
def test_deadline_incomplete_output_and_no_server(client):
    with pytest.raises(fc.DeadlineExceededError):
        client.generate("Once upon a time", max_tokens=64, ignore_eos=True, timeout=0.001)
    with pytest.raises(fc.IncompleteOutputError) as info:
        client.extract(PERSON_SCHEMA, TEXT, max_tokens=2, close_early=False)  # on, 2 tokens is refused
    assert info.value.finish_reason == "FINISH_REASON_LENGTH" and info.value.text
    with unserved_address() as address, fc.Client(address, timeout=10) as nowhere, pytest.raises(fc.UnavailableError):
        nowhere.model_info()


# ---- live: the asyncio client ------------------------------------------------------------------


@pytest.mark.slow
def test_async_client(server):
    async def main() -> None:
        async with fc.AsyncClient(server.address, timeout=120) as client:
            person = await client.extract(PERSON_SCHEMA, "Bob is a 20 year old baker.", max_tokens=40)
            jsonschema.validate(person, PERSON_SCHEMA)
            chunks = [m async for m in client.stream("One, two,", max_tokens=4, temperature=0)]
            assert chunks[-1].usage.completion_tokens == sum(len(m.token_ids) for m in chunks)
            assert (await client.validate_constraint(fc.json_object())).ok
            assert (await client.model_info()).limits.max_tokens_cap == 256
            with pytest.raises(fc.InvalidArgumentError) as info:
                await client.generate("hi", max_tokens=999)
            assert info.value.field_violations[0].field == "max_tokens"
            with pytest.raises(fc.DeadlineExceededError):
                await client.generate("Once upon a time", max_tokens=64, ignore_eos=True, timeout=0.001)
            # cancelling the awaiting task is asyncio's CancelledError, and frees the request
            task = asyncio.create_task(client.generate("Count: one, two,", max_tokens=200, ignore_eos=True))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    load = server.wait_idle()
    assert load.num_in_flight == load.num_running == 0


# ---- live: the CLI -----------------------------------------------------------------------------


def run_cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "--address", server.address, "--timeout", "120", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_cli_extract(server, tmp_path):
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(PERSON_SCHEMA))
    result = run_cli(server, "extract", "--schema", str(schema_file), "--text", TEXT, "--max-tokens", "40")
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(result.stdout), PERSON_SCHEMA)


@pytest.mark.slow
def test_cli_generate_validate_and_errors(server, tmp_path):
    result = run_cli(server, "generate", "--prompt", "Is the sky blue?", "--choice", "yes", "--choice", "no",
                     "--max-tokens", "4", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["text"] in ("yes", "no")
    result = run_cli(server, "generate", "--prompt", "The sky is", "--raw", "--max-tokens", "3", "--stream")
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    result = run_cli(server, "validate", "--regex", "[a-z")
    assert result.returncode == 1 and json.loads(result.stdout)["ok"] is False
    schema_file = tmp_path / "bad.json"
    schema_file.write_text('{"type": "object", "properties": {"a": {"type": "nonsense"}}}')
    result = run_cli(server, "extract", "--schema", str(schema_file), "--text", "x")
    assert result.returncode == 1
    assert result.stderr.startswith("formwork-client: INVALID_ARGUMENT: constraint.json_schema_text: ")
    assert "  constraint.json_schema_text: json_schema does not compile" in result.stderr
