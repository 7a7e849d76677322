"""Bytes that do not decode: the field at fault is named, nothing raises."""
from __future__ import annotations

import random

import pytest
from google.protobuf import json_format
from google.protobuf.internal import encoder

from service._gen.formwork.v1 import generation_pb2 as pb
from service.grpc.request_decoding import UndecodableRequest, tolerant_deserializer

MARK = "MARKER-MARKER"


def with_bad_utf8(message_type, fields: dict) -> bytes:
    data = json_format.ParseDict(fields, message_type()).SerializeToString()
    index = data.index(MARK.encode())
    return data[:index] + b"\xff" * len(MARK) + data[index + len(MARK):]


@pytest.mark.parametrize("message_type, fields, field", [
    (pb.GenerateRequest, {"prompt": MARK}, "prompt"),
    (pb.GenerateRequest, {"prompt": "x", "request_id": MARK}, "request_id"),
    (pb.GenerateRequest, {"chat": {"messages": [{"role": "user", "content": "a"}, {"role": MARK}]}},
     "chat.messages[1].role"),
    (pb.GenerateRequest, {"prompt": "x", "stop": ["a", "b", MARK]}, "stop[2]"),
    (pb.GenerateRequest, {"prompt": "x", "constraint": {"choice": {"choices": [MARK]}}}, "constraint.choice.choices[0]"),
    (pb.GenerateRequest, {"prompt": "x", "constraint": {"json_schema": {"properties": {MARK: {}}}}},
     "constraint.json_schema"),
    (pb.TokenizeRequest, {"chat": {"messages": [{"role": "user", "content": MARK}]}}, "chat.messages[0].content"),
    (pb.ValidateConstraintRequest, {"constraint": {"grammar": f'root ::= "{MARK}"'}}, "constraint.grammar"),
])
def test_invalid_utf8_names_the_field(message_type, fields, field):
    result = tolerant_deserializer(message_type)(with_bad_utf8(message_type, fields))
    assert result == UndecodableRequest(field, "is not valid UTF-8 (byte 0 of the string)") or (
        result.field == field and result.description.startswith("is not valid UTF-8"))


def test_good_bytes_decode_as_usual():
    message = pb.GenerateRequest(prompt="héllo", max_tokens=3)
    assert tolerant_deserializer(pb.GenerateRequest)(message.SerializeToString()) == message


def test_garbage_never_raises():
    deserialize = tolerant_deserializer(pb.GenerateRequest)
    rng = random.Random(0)
    for _ in range(500):
        result = deserialize(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
        assert isinstance(result, (pb.GenerateRequest, UndecodableRequest))
    assert deserialize(b"\xff" * 11) == UndecodableRequest(
        "request", "is not a valid formwork.v1.GenerateRequest message (malformed protobuf data at byte 0)")


def test_a_struct_past_the_depth_limit_is_named():
    def field(number: int, payload: bytes) -> bytes:
        return encoder._VarintBytes((number << 3) | 2) + encoder._VarintBytes(len(payload)) + payload
    struct = b""
    for _ in range(60):  # Struct.fields -> entry.value -> Value.struct_value -> ...
        struct = field(1, field(1, b"a") + field(2, field(5, struct)))
    data = field(1, b"hi") + field(20, field(1, struct))  # GenerateRequest.constraint.json_schema
    result = tolerant_deserializer(pb.GenerateRequest)(data)
    assert result.field == "constraint.json_schema" and "nested more than 100" in result.description


def test_a_field_this_server_does_not_know_is_named_not_dropped():
    def varint_field(number: int, value: int) -> bytes:
        return encoder._VarintBytes(number << 3) + encoder._VarintBytes(value)

    def message_field(number: int, payload: bytes) -> bytes:
        return encoder._VarintBytes((number << 3) | 2) + encoder._VarintBytes(len(payload)) + payload

    prompt = pb.GenerateRequest(prompt="hi").SerializeToString()
    top = tolerant_deserializer(pb.GenerateRequest)(prompt + varint_field(999, 5))
    assert top == UndecodableRequest("request", "has field number 999, which this server's formwork.v1.GenerateRequest "
                                                "does not know (a client built from a newer formwork.v1?); upgrade "
                                                "the server or leave the field out")
    chat = pb.GenerateRequest(chat={"messages": [{"role": "user", "content": "a"}]}).SerializeToString()
    message = message_field(1, pb.ChatMessage(role="user", content="b").SerializeToString() + varint_field(99, 1))
    # a second `chat` field merges into the first: its message becomes messages[1]
    nested = tolerant_deserializer(pb.GenerateRequest)(chat + message_field(3, message))
    assert nested.field == "chat.messages[1]" and "field number 99" in nested.description
    assert "formwork.v1.ChatMessage" in nested.description
