"""Qwen3-Coder's tool calls: one XML-ish block per call, each argument a parameter of its own:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is typed by the tool's schema: a string parameter is written raw (so it cannot hold
"\n</parameter>\n", where it ends), any other value as JSON.
The syntax reads calls back as OpenAI's arguments JSON, keys in the order written, so the
arguments streamed while a call is written add up to the final ones. Library-free.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from grammar.chat.call_reader import CallReader, scan_calls, skip_space
from grammar.chat.structural_tag import Format
from grammar.chat.tool import CompileLeaf, Tool


_FUNCTION = "<function="
_PARAMETER = "<parameter="
# a raw value ends at the first of these (so it cannot hold one)
_PARAMETER_END = "\n</parameter>\n"
_CALL_END = "</function>\n</tool_call>"
# keywords of the parameters object the parameter form cannot carry
_OBJECT_KEYWORDS = ("anyOf", "oneOf", "allOf", "not", "if", "$ref", "patternProperties", "propertyNames",
                    "dependentRequired", "dependentSchemas", "dependencies", "minProperties", "maxProperties",
                    "unevaluatedProperties")
# keywords of a raw string value beyond enum / const / pattern
_STRING_BOUNDS = ("minLength", "maxLength")
_STRING_OTHER = ("format", "contentEncoding", "contentMediaType")


@dataclass(frozen=True)
class XmlParameterSyntax(CallReader):
    """Calls as `<tool_call>` blocks holding `<function=NAME>` and one `<parameter=ARG>` per
    argument. `for_tools` binds the tools' schemas, which type each value; unbound, a value that
    reads as JSON is JSON and any other is a string."""

    name: str = "qwen3_coder"
    trigger: str = "<tool_call>"
    separator: str = "\n"  # between two calls
    wrapped: bool = False
    # tool name -> its parameters schema (bound by for_tools)
    schemas: dict[str, Any] = field(default_factory=dict, compare=False)

    def for_tools(self, tools: tuple[Tool, ...] | list[Tool]) -> XmlParameterSyntax:
        return dataclasses.replace(self, schemas={t.name: t.schema for t in tools})

    # -- writing -------------------------------------------------------------------------------

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """`calls` ((name, arguments: an object, or its JSON text) pairs) as the model writes them."""
        return self.separator.join(self._render_call(name, arguments) for name, arguments in calls)

    def _render_call(self, name: str, arguments: Any) -> str:
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        if not isinstance(arguments, dict):
            raise ValueError(f"the arguments of a call to {name!r} must be a JSON object")
        body = "".join(f"{_PARAMETER}{key}>\n{self._value_text(name, key, value)}{_PARAMETER_END}"
                       for key, value in arguments.items())
        return f"<tool_call>\n{_FUNCTION}{name}>\n{body}{_CALL_END}"

    def _value_text(self, tool_name: str, key: str, value: Any) -> str:
        kind = self._kind(tool_name, key)
        if kind == "raw" or (kind == "unknown" and isinstance(value, str)):
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return json.dumps(value, ensure_ascii=False)

    # -- reading -------------------------------------------------------------------------------

    def scan(self, text: str) -> tuple[str, list[tuple[str, str]], int | None]:
        """(the text outside the calls, unstripped, with only separators between calls dropped;
        the calls; where a call begins that is not complete or does not read, or None)."""
        return scan_calls(text, self.trigger, self._complete_call_at, " \n")

    def _complete_call_at(self, text: str, at: int) -> tuple[int, list[tuple[str, str]]] | None:
        """(the end of the call at `at`, [(its name, its arguments)]), or None while it is not
        complete or where it does not read."""
        call = self._read(text, at)
        if call.end is None:
            return None
        arguments = self._arguments(call, final=True)
        return None if arguments is None else (call.end, [(call.name, arguments)])

    def partial_calls(self, text: str, at: int) -> list[tuple[str, str]]:
        """The call begun at `at` that `scan` found not complete yet: [(name, the arguments text
        written so far)], for streaming; [] while its name is not complete."""
        call = self._read(text, at)
        if not call.name:
            return []
        return [(call.name, self._arguments(call, final=False) or "")]

    def _read(self, text: str, at: int) -> _Call:
        """The call at `at` as far as it is written (and reads)."""
        call = _Call()
        pos = skip_space(text, at + len(self.trigger))
        if not text.startswith(_FUNCTION, pos):
            return call
        name_end = text.find(">", pos)
        if name_end < 0 or "\n" in text[pos:name_end]:
            return call
        call.name = text[pos + len(_FUNCTION):name_end]
        pos = skip_space(text, name_end + 1)
        while pos < len(text):
            if text.startswith(_PARAMETER, pos):
                key_end = text.find(">", pos)
                if key_end < 0 or "\n" in text[pos:key_end]:
                    return call
                key = text[pos + len(_PARAMETER):key_end]
                start = key_end + 1
                if text.startswith("\n", start):
                    start += 1
                end = text.find(_PARAMETER_END, start)
                if end < 0:
                    call.parameters.append((key, text[start:], False))
                    return call
                call.parameters.append((key, text[start:end], True))
                pos = skip_space(text, end + len(_PARAMETER_END))
            elif text.startswith("</function>", pos):
                pos = skip_space(text, pos + len("</function>"))
                if text.startswith("</tool_call>", pos):
                    call.end = pos + len("</tool_call>")
                return call
            else:
                return call
        return call

    def _arguments(self, call: _Call, final: bool) -> str | None:
        """The call's arguments as JSON text: all of them (`final`; None if a value does not read
        as its schema's JSON), or the prefix of that text written so far."""
        pieces: list[str] = []
        for key, value, closed in call.parameters:
            kind = self._kind(call.name, key)
            written = json.dumps(key, ensure_ascii=False) + ": "
            if closed:
                piece = _closed_value(kind, value)
                if piece is None:
                    return None if final else "{" + ", ".join(pieces)
                pieces.append(written + piece)
                continue
            held = _without_end_prefix(value)
            if kind == "raw":
                pieces.append(written + json.dumps(held, ensure_ascii=False)[:-1])
            elif kind == "json" and held.strip():
                pieces.append(written + held.strip())
            return "{" + ", ".join(pieces)
        return "{" + ", ".join(pieces) + ("}" if final or call.end is not None else "")

    def _kind(self, tool_name: str, key: str) -> str:
        """"raw" (a string, written as it is), "json", or "unknown" (no schema says)."""
        schema = self.schemas.get(tool_name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict) or key not in properties:
            return "unknown"
        return "raw" if is_raw_string(properties[key]) else "json"

    # -- the constrained format ----------------------------------------------------------------

    def call_tag(self, name: str, content: Format) -> Format:
        """One call of `name`; `content`: its parameters (arguments_format)."""
        return {"type": "tag", "begin": f"<tool_call>\n{_FUNCTION}{name}>\n", "content": content,
                "end": "\n</tool_call>"}

    def closing_words(self, tool: Tool) -> list[str]:
        """Words that close a call of `tool` from inside a value, which a closing search cannot
        spell a character at a time: the ends, the required parameters' openings, and from the
        end of each value the rest of the call as far as the required parameters after it can be
        left empty."""
        schema = tool.schema if isinstance(tool.schema, dict) else {}
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or ())
        keys = list(properties)
        words = [_PARAMETER_END, _CALL_END] + [f"{_PARAMETER}{key}>\n" for key in keys if key in required]
        for index in range(len(keys)):
            rest = _PARAMETER_END
            for key in (k for k in keys[index + 1:] if k in required):
                rest += f"{_PARAMETER}{key}>\n"
                if not _may_be_empty(properties[key]):
                    break
                rest += _PARAMETER_END
            else:
                rest += _CALL_END
            words.append(rest)
        return words

    def raw_patterns(self, tool: Tool) -> list[str]:
        """The regexes of `tool`'s string values written raw (their `pattern`s)."""
        schema = tool.schema if isinstance(tool.schema, dict) else {}
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return [p["pattern"] for p in properties.values()
                if is_raw_string(p) and isinstance(p.get("pattern"), str)]

    def arguments_format(self, tool: Tool, compile_leaf: CompileLeaf) -> tuple[Format, list[str], list[str]]:
        """(the parameters of one call of `tool` as a format, each value's leaf compiled by
        `compile_leaf(leaf, parameter name)`; the narrowings chosen; the keywords not enforced).

        The parameters come in the schema's property order, each required one present, each
        optional one present or not; a parameter not among the properties cannot be written."""
        schema = tool.schema if isinstance(tool.schema, dict) else {}
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or ())
        definitions = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        narrowed: list[str] = []
        unenforced = [f"{keyword} of the parameters object" for keyword in _OBJECT_KEYWORDS if keyword in schema]
        unenforced += [f'required parameter "{key}" is not among the properties'
                       for key in sorted(required - set(properties))]
        elements: list[Format] = []
        for key, sub_schema in properties.items():
            leaf, narrowings, keywords = _value_leaf(sub_schema, definitions)
            narrowed += [f'parameter "{key}": {note}' for note in narrowings]
            unenforced += [f'{keyword} of parameter "{key}"' for keyword in keywords]
            tag = {"type": "tag", "begin": f"{_PARAMETER}{key}>\n", "content": compile_leaf(leaf, key)
                   if leaf["type"] != "any_text" else leaf, "end": _PARAMETER_END}
            elements.append(tag if key in required else {"type": "tags_with_separator", "tags": [tag],
                                                          "separator": "", "at_least_one": False,
                                                          "stop_after_first": True})
        elements.append({"type": "const_string", "value": "</function>"})
        return {"type": "sequence", "elements": elements}, narrowed, unenforced


@dataclass
class _Call:
    name: str = ""  # "" until its name is complete
    # (parameter name, its value as written so far, whether its end was written)
    parameters: list[tuple[str, str, bool]] = field(default_factory=list)
    end: int | None = None  # just past the call; None: not complete


def is_raw_string(schema: Any) -> bool:
    """Whether a parameter's values are strings only, so written raw, not as JSON."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "string":
        return True
    if "type" in schema:
        return False
    if "const" in schema:
        return isinstance(schema["const"], str)
    return isinstance(schema.get("enum"), list) and bool(schema["enum"]) and all(
        isinstance(v, str) for v in schema["enum"])


def _may_be_empty(schema: Any) -> bool:
    """Whether a value may be written as nothing (a raw string without a lower bound or pattern)."""
    return is_raw_string(schema) and not any(k in schema for k in ("minLength", "pattern", "enum", "const"))


def _value_leaf(schema: Any, definitions: dict[str, Any]) -> tuple[Format, list[str], list[str]]:
    """The content leaf of one parameter's value; the narrowings it makes; the keywords it leaves
    unenforced."""
    if not is_raw_string(schema):
        if isinstance(schema, dict) and definitions and "$ref" in json.dumps(schema):
            schema = {**definitions, **schema}  # its $refs point at the tool schema's root
        return {"type": "json_schema", "json_schema": schema}, [], []
    if "const" in schema:
        return {"type": "regex", "pattern": re.escape(schema["const"])}, [], []
    if "enum" in schema:
        return {"type": "regex", "pattern": "|".join(re.escape(v) for v in schema["enum"])}, [], []
    unenforced = [k for k in _STRING_OTHER if k in schema]
    if "pattern" in schema:
        unenforced += [k for k in _STRING_BOUNDS if k in schema]
        return {"type": "regex", "pattern": schema["pattern"]}, ["the pattern matches the whole value"], unenforced
    if any(k in schema for k in _STRING_BOUNDS):
        low, high = schema.get("minLength", 0), schema.get("maxLength", "")
        return ({"type": "regex", "pattern": f"[^\\n]{{{low},{high}}}"},
                ["a string with minLength / maxLength is written on one line"], unenforced)
    return {"type": "any_text"}, [], unenforced


def _closed_value(kind: str, value: str) -> str | None:
    """A complete value as the JSON text of the arguments; None if it does not read."""
    if kind == "raw":
        return json.dumps(value, ensure_ascii=False)
    try:
        json.loads(value)
    except json.JSONDecodeError:
        return None if kind == "json" else json.dumps(value, ensure_ascii=False)
    return value.strip()


def _without_end_prefix(value: str) -> str:
    """A growing value without a tail that may be the start of its end."""
    for size in range(min(len(_PARAMETER_END), len(value)), 0, -1):
        if _PARAMETER_END.startswith(value[-size:]):
            return value[:-size]
    return value
