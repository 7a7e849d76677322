"""Request bytes -> messages, with a precise answer for bytes that do not decode.

grpc hands each request's bytes to a deserializer; protobuf's refuses invalid UTF-8 in a string
field, nesting past its depth limit and malformed wire data with one message that names no
field, and grpc answers that as UNKNOWN after logging a traceback. Here the deserializer never
raises: it returns an `UndecodableRequest` naming the field, which the servicer answers with
INVALID_ARGUMENT and one log line. Finding the field walks the wire format once more, without
recursion, only for the bytes that failed.

A field number this server's formwork.v1 does not know (a client built from a newer proto) is
refused the same way rather than dropped: protobuf keeps such fields aside as unknown, and a
request field silently ignored is an answer the client misreads.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor as descriptor_mod
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

# protobuf's (upb's) default decoding depth, in message levels
MAX_MESSAGE_DEPTH = 100
_MESSAGE = descriptor_mod.FieldDescriptor.TYPE_MESSAGE
_STRING = descriptor_mod.FieldDescriptor.TYPE_STRING


@dataclass(frozen=True)
class UndecodableRequest:
    """Stands in for a request whose bytes did not decode."""

    field: str  # the request field at fault, or "request" for the message as a whole
    description: str


def tolerant_deserializer(message_class: type[Message]) -> Callable[[bytes], Any]:
    """A grpc request deserializer returning the message, or an UndecodableRequest."""

    def deserialize(data: bytes) -> Message | UndecodableRequest:
        try:
            message = message_class.FromString(data)
        except DecodeError:
            return diagnose(message_class.DESCRIPTOR, data)
        return unknown_field(message) or message

    return deserialize


def unknown_field(message: Message, path: str = "") -> UndecodableRequest | None:
    """The first field of `message` (or of a message inside it) whose number this server's
    formwork.v1 does not know, named by where it sits; None if there is none."""
    unknown = UnknownFieldSet(message)
    if len(unknown):
        return UndecodableRequest(path or "request", f"has field number {unknown[0].field_number}, which this "
                                                     f"server's {message.DESCRIPTOR.full_name} does not know (a "
                                                     f"client built from a newer formwork.v1?); upgrade the "
                                                     f"server or leave the field out")
    for field, value in message.ListFields():
        if field.type != _MESSAGE or _is_well_known(field.message_type):
            continue
        name = f"{path}.{field.name}" if path else field.name
        for index, inner in enumerate(value if field.is_repeated else [value]):
            found = unknown_field(inner, f"{name}[{index}]" if field.is_repeated else name)
            if found is not None:
                return found
    return None


def diagnose(descriptor: descriptor_mod.Descriptor, data: bytes) -> UndecodableRequest:
    """Why `data` is not a valid message of `descriptor`: the first string field that is not
    UTF-8, the field nested too deeply, or malformed wire data (with its byte offset)."""
    # frames: (descriptor, position, end, path, occurrences of each repeated field so far)
    stack: list[tuple[Any, int, int, str, dict[int, int]]] = [(descriptor, 0, len(data), "", {})]
    while stack:
        message, pos, end, path, seen = stack.pop()
        if pos >= end:
            continue
        try:
            key, pos = _varint(data, pos, end)
            number, wire_type = key >> 3, key & 7
            field = message.fields_by_number.get(number)
            # inside google.protobuf.Struct / Value / ListValue, name the field that holds it
            name = path if field is None or _is_well_known(message) else _field_path(path, field, seen)
            if wire_type == 0:
                _, next_pos = _varint(data, pos, end)
            elif wire_type in (1, 5):
                next_pos = pos + (8 if wire_type == 1 else 4)
            elif wire_type == 2:
                length, pos = _varint(data, pos, end)
                next_pos = pos + length
            else:
                raise ValueError(f"wire type {wire_type}")
            if next_pos > end:
                raise ValueError("a length past the end")
        except ValueError:
            return UndecodableRequest(path or "request", f"is not a valid {descriptor.full_name} message "
                                                         f"(malformed protobuf data at byte {pos})")
        stack.append((message, next_pos, end, path, seen))
        if wire_type != 2 or field is None:
            continue
        if field.type == _STRING:
            try:
                data[pos:next_pos].decode("utf-8")
            except UnicodeDecodeError as e:
                return UndecodableRequest(name, f"is not valid UTF-8 (byte {e.start} of the string)")
        elif field.type == _MESSAGE:
            if len(stack) > MAX_MESSAGE_DEPTH:
                return UndecodableRequest(name, _too_deep())
            stack.append((field.message_type, pos, next_pos, name, {}))
    return UndecodableRequest("request", f"is not a valid {descriptor.full_name} message")


def _too_deep() -> str:
    return (f"is nested more than {MAX_MESSAGE_DEPTH} protobuf message levels deep (one schema level inside a "
            "Struct takes up to six, so about 16 fit); send a deeply nested schema as json_schema_text")


def _is_well_known(message: descriptor_mod.Descriptor) -> bool:
    return message.full_name.startswith("google.protobuf.")


def _field_path(path: str, field: Any, seen: dict[int, int]) -> str:
    name = f"{path}.{field.name}" if path else field.name
    if not field.is_repeated:
        return name
    index = seen.get(field.number, 0)
    seen[field.number] = index + 1
    return f"{name}[{index}]"


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("a truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
