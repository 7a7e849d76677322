"""Which string a token would add to an array whose strings must be distinct, and whether it is
already there: the runtime half of `uniqueItems` over arrays of strings, which neither grammar
backend can express.

A tracker reads the output bytes as JSON (the grammar keeps them valid JSON, so it never checks
syntax): a stack of the open objects and arrays, each with its place in the schema's path tree
(grammar/json_schema/unique_strings.py: {"unique", "properties", "additional", "items"}, None
for a part of the instance that holds no such array). In an array marked unique it keeps the
elements closed so far, decoded (so "\\u0061" and "a" are one value), and `feed` answers False
at the quote that would close an element equal to one of them. Library-free; frames are copied
on write, so `clone` is cheap enough to try each token that holds a quote.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

_QUOTE, _BACKSLASH = 0x22, 0x5C
_OBJECT_OPEN, _OBJECT_CLOSE, _ARRAY_OPEN, _ARRAY_CLOSE = 0x7B, 0x7D, 0x5B, 0x5D
_COMMA = 0x2C


@dataclass(frozen=True)
class _Frame:
    node: dict | None  # the path tree's node for this container; None: nothing tracked inside
    is_object: bool
    expects_key: bool = False  # an object between "{" or "," and its next key
    key: str | None = None  # an object's current key (once read), tracked objects only
    seen: frozenset = frozenset()  # a unique array's elements so far


class UniqueStringsTracker:
    """One output's JSON structure, as far as the arrays of distinct strings need it."""

    def __init__(self, root: dict | None) -> None:
        self._root = root
        self._stack: list[_Frame] = []
        self._in_string = self._escaped = False
        self._role = ""  # the open string's: "key", "element" (of a unique array) or "" (untracked)
        self._raw = bytearray()  # the open string's bytes, kept for a key or an element

    def clone(self) -> UniqueStringsTracker:
        other = object.__new__(UniqueStringsTracker)
        other.__dict__.update(self.__dict__)
        other._stack = list(self._stack)
        other._raw = bytearray(self._raw)
        return other

    @property
    def in_unique_array(self) -> bool:
        """Whether the innermost open container is an array of distinct strings: only then can
        a token close one of its elements."""
        return bool(self._stack) and not self._stack[-1].is_object and _unique(self._stack[-1].node)

    def feed(self, data: Iterable[int]) -> bool:
        """Advance over `data` (the bytes of one or more tokens); False, with the tracker left
        part-way, when they close an element equal to an earlier one of its array."""
        for byte in data:
            if self._in_string:
                if not self._string_byte(byte):
                    return False
            elif byte == _QUOTE:
                self._open_string()
            elif byte == _OBJECT_OPEN or byte == _ARRAY_OPEN:
                self._stack.append(_Frame(self._child(), byte == _OBJECT_OPEN, expects_key=byte == _OBJECT_OPEN))
            elif byte == _OBJECT_CLOSE or byte == _ARRAY_CLOSE:
                if self._stack:
                    self._stack.pop()
            elif byte == _COMMA and self._stack and self._stack[-1].is_object:
                self._stack[-1] = replace(self._stack[-1], expects_key=True)
        return True

    def _child(self) -> dict | None:
        """The path tree's node for a value starting here."""
        if not self._stack:
            return self._root
        frame = self._stack[-1]
        if frame.node is None:
            return None
        if not frame.is_object:
            return frame.node.get("items")
        properties = frame.node.get("properties", {})
        return properties[frame.key] if frame.key in properties else frame.node.get("additional")

    def _open_string(self) -> None:
        self._in_string, self._escaped = True, False
        frame = self._stack[-1] if self._stack else None
        if frame is not None and frame.is_object and frame.expects_key:
            self._role = "key" if frame.node is not None else ""
            self._stack[-1] = replace(frame, expects_key=False, key=None)
        elif frame is not None and not frame.is_object and _unique(frame.node):
            self._role = "element"
        else:
            self._role = ""
        self._raw.clear()

    def _string_byte(self, byte: int) -> bool:
        if self._escaped:
            self._escaped = False
        elif byte == _BACKSLASH:
            self._escaped = True
        elif byte == _QUOTE:
            self._in_string = False
            return self._close_string()
        if self._role:
            self._raw.append(byte)
        return True

    def _close_string(self) -> bool:
        if not self._role:
            return True
        value = json.loads(b'"' + bytes(self._raw) + b'"')
        frame = self._stack[-1]
        if self._role == "key":
            self._stack[-1] = replace(frame, key=value)
            return True
        if value in frame.seen:
            return False
        self._stack[-1] = replace(frame, seen=frame.seen | {value})
        return True


def _unique(node: Any) -> bool:
    return isinstance(node, dict) and bool(node.get("unique"))
