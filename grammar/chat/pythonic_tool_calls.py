"""Calls written as Python: Llama 3.2's (and Llama 4's) pythonic list,

    [get_weather(city="Paris", days=3), get_time(zone="CET")]

and Gemma's documented function-calling form, the same calls one per line in a fenced block,

    ```tool_code
    get_weather(city="Paris", days=3)
    ```

each argument a keyword whose value is a Python literal. Read back as OpenAI's arguments JSON,
keys in the order written; while a call is written its arguments stream one whole argument at a
time (a Python literal is JSON only once it is complete). Library-free.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from grammar.chat.call_reader import CallReader, skip_space
from grammar.chat.structural_tag import Format
from grammar.chat.tool import CompileLeaf, Tool

_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JSON_CONSTANTS = {"true": True, "false": False, "null": None}
# keywords of the parameters object a keyword-argument list cannot carry
_OBJECT_KEYWORDS = ("anyOf", "oneOf", "allOf", "not", "if", "$ref", "patternProperties", "propertyNames",
                    "dependentRequired", "dependentSchemas", "dependencies", "minProperties", "maxProperties",
                    "unevaluatedProperties")


@dataclass(frozen=True)
class PythonicSyntax(CallReader):
    """All of a turn's calls, `name(key=value, ...)`, between `open` and `close` (a `[...]` list;
    Gemma: a ```tool_code block). The constraint writes a top-level boolean or null as Python
    (`True`, `None`) and every other value as JSON, which is a Python literal but for the
    constants nested inside it (`true`); both read back. `trigger` is `open` up to its whitespace."""

    name: str = "pythonic"
    open: str = "["
    close: str = "]"
    separator: str = ", "  # between two calls
    trigger: str = "["
    wrapped: bool = True

    def for_tools(self, tools: tuple[Tool, ...] | list[Tool]) -> PythonicSyntax:
        return self

    # -- writing -------------------------------------------------------------------------------

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """`calls` ((name, arguments: an object, or its JSON text) pairs) as the model writes them."""
        written = []
        for name, arguments in calls:
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(arguments, dict):
                raise ValueError(f"the arguments of a call to {name!r} must be a JSON object")
            written.append(f"{name}(" + ", ".join(f"{key}={python_literal(value)}"
                                                  for key, value in arguments.items()) + ")")
        return self.open + self.separator.join(written) + self.close

    # -- reading -------------------------------------------------------------------------------

    def scan(self, text: str) -> tuple[str, list[tuple[str, str]], int | None]:
        """(the text outside the calls, unstripped; the calls; where a list of calls begins that
        is not complete or does not read, or None). A `[` that cannot begin a call is text."""
        calls: list[tuple[str, str]] = []
        kept: list[str] = []
        pos = 0
        search = 0
        while True:
            at = text.find(self.trigger, search)
            if at < 0:
                break
            found = self._read_list(text, at)
            if found.end is None:
                if found.may_be_calls:
                    kept.append(text[pos:at])
                    return "".join(p for p in kept if p.strip(" \n")), calls, at
                search = at + 1  # a bracket (or a fence) in the text
                continue
            kept.append(text[pos:at])
            calls += [(call.name, _arguments(call, final=True)) for call in found.calls]
            pos = search = found.end
        kept.append(text[pos:])
        return "".join(p for p in kept if p.strip(" \n")), calls, None

    def partial_calls(self, text: str, at: int) -> list[tuple[str, str]]:
        """The calls of the list begun at `at` that `scan` found not complete yet: (name, the
        arguments text written so far, whole arguments only), for streaming."""
        return [(call.name, _arguments(call, final=False)) for call in self._read_list(text, at).calls]

    def _read_list(self, text: str, at: int) -> _List:
        """The calls at `at` (the trigger) as far as they are written and read."""
        found = _List()
        closer, between = self.close.strip(), self.separator.strip()  # "" between: calls follow one another
        pos = skip_space(text, at + len(self.trigger))
        while True:
            name = _NAME.match(text, pos)
            if name is None or name.end() == len(text):
                found.may_be_calls = pos == len(text) or (name is not None and name.start() == pos)
                return found
            pos = skip_space(text, name.end())
            if pos == len(text):
                return found
            if text[pos] != "(":
                found.may_be_calls = False
                return found
            call = _Call(name.group())
            found.calls.append(call)
            pos = skip_space(text, pos + 1)
            while pos < len(text) and text[pos] != ")":
                key = _KEY.match(text, pos)
                if key is None:
                    found.may_be_calls = False
                    return found
                pos = skip_space(text, key.end())
                if not text.startswith("=", pos):
                    found.may_be_calls = pos == len(text)
                    return found
                start = skip_space(text, pos + 1)
                end = _value_end(text, start)
                if end is None:
                    return found
                value = _literal(text[start:end])
                if value is _NOT_A_LITERAL:
                    found.may_be_calls = False
                    return found
                call.arguments.append((key.group(), value))
                pos = skip_space(text, end)
                if text.startswith(",", pos):
                    pos = skip_space(text, pos + 1)
            if pos >= len(text):
                return found
            pos = skip_space(text, pos + 1)  # past the `)`
            if text.startswith(closer, pos):
                found.end = pos + len(closer)
                return found
            if closer.startswith(text[pos:]):  # the close may still be coming
                return found
            if between:
                if not text.startswith(between, pos):
                    found.may_be_calls = False
                    return found
                pos = skip_space(text, pos + len(between))

    # -- the constrained format ----------------------------------------------------------------

    def call_tag(self, name: str, content: Format) -> Format:
        """One call of `name`; `content`: its keyword arguments and the closing parenthesis
        (arguments_format)."""
        return {"type": "tag", "begin": f"{name}(", "content": content, "end": ""}

    def closing_words(self, tool: Tool) -> list[str]:
        return [")", ")" + self.close]

    def raw_patterns(self, tool: Tool) -> list[str]:
        return []

    def arguments_format(self, tool: Tool, compile_leaf: CompileLeaf) -> tuple[Format, list[str], list[str]]:
        """(the keyword arguments of one call of `tool` and its `)`, each value compiled by
        `compile_leaf(leaf, parameter name)`; the narrowings chosen; the keywords not enforced).

        The required parameters come first, then the optional ones, each in the schema's order;
        a parameter not among the properties cannot be written."""
        schema = tool.schema if isinstance(tool.schema, dict) else {}
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or ())
        definitions = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        unenforced = [f"{keyword} of the parameters object" for keyword in _OBJECT_KEYWORDS if keyword in schema]
        unenforced += [f'required parameter "{key}" is not among the properties'
                       for key in sorted(required - set(properties))]
        narrowed = []
        if any(not _KEY.fullmatch(key) for key in properties):
            unenforced.append("a parameter name that is not a Python identifier")
        keys = [k for k in properties if k in required and _KEY.fullmatch(k)]
        optional = [k for k in properties if k not in required and _KEY.fullmatch(k)]
        if optional and keys and list(properties).index(optional[0]) < list(properties).index(keys[-1]):
            narrowed.append("the required parameters come before the optional ones")

        def value(key: str) -> Format:
            leaf = _value_leaf(properties[key], definitions)
            return leaf if leaf["type"] == "const_string" else compile_leaf(leaf, key)

        def argument(key: str) -> Format:  # one after the first
            return {"type": "tag", "begin": f", {key}=", "content": value(key), "end": ""}

        def maybe(key: str) -> Format:
            return {"type": "tags_with_separator", "tags": [argument(key)], "separator": "", "at_least_one": False,
                    "stop_after_first": True}

        def from_first(key: str, rest: list[Format]) -> Format:
            # the arguments from the first one written to the `)`: a tag with an end, as xgrammar
            # needs around optional parts
            return {"type": "tag", "begin": f"{key}=", "content": {"type": "sequence", "elements": [value(key), *rest]},
                    "end": ")"}

        if keys:
            rest = [argument(k) for k in keys[1:]] + [maybe(k) for k in optional]
            return from_first(keys[0], rest), narrowed, unenforced
        choices: list[Format] = [{"type": "const_string", "value": ")"}]
        choices += [from_first(key, [maybe(k) for k in optional[index + 1:]]) for index, key in enumerate(optional)]
        return {"type": "or", "elements": choices} if len(choices) > 1 else choices[0], narrowed, unenforced


@dataclass
class _Call:
    name: str
    arguments: list[tuple[str, Any]] = field(default_factory=list)  # the complete ones, in order


@dataclass
class _List:
    calls: list[_Call] = field(default_factory=list)  # those whose name is complete
    end: int | None = None  # just past the `]`; None: not complete, or not calls
    may_be_calls: bool = True  # False: the text at the bracket is not a call list


def python_literal(value: Any) -> str:
    """A JSON value as a Python literal (strings as JSON writes them, which Python reads alike)."""
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _value_end(text: str, start: int) -> int | None:
    """Where the value at `start` ends (a `,` or `)` outside brackets and strings); None: not yet."""
    depth = 0
    quote = ""
    pos = start
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return pos
            depth -= 1
        elif char == "," and depth == 0:
            return pos
        pos += 1
    return None


_NOT_A_LITERAL = object()


def _literal(written: str) -> Any:
    """A complete value as written: JSON first (the constraint writes JSON), else a Python
    literal, whose nested `true` / `false` / `null` read as JSON's."""
    written = written.strip()
    try:
        return json.loads(written)
    except json.JSONDecodeError:
        pass
    except RecursionError:
        return _NOT_A_LITERAL
    try:
        tree = ast.fix_missing_locations(_JsonConstants().visit(ast.parse(written, mode="eval")))
        value = ast.literal_eval(tree)
        json.dumps(value, allow_nan=False)  # a set, bytes or inf is no JSON value
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_A_LITERAL
    return value


class _JsonConstants(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _JSON_CONSTANTS:
            return ast.copy_location(ast.Constant(_JSON_CONSTANTS[node.id]), node)
        return node


def _arguments(call: _Call, final: bool) -> str:
    pieces = [json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
              for key, value in call.arguments]
    return "{" + ", ".join(pieces) + ("}" if final else "")


def _value_leaf(schema: Any, definitions: dict[str, Any]) -> Format:
    """A top-level boolean or null as Python's constant; any other value as JSON."""
    if isinstance(schema, dict) and schema.get("type") == "boolean" and not {"enum", "const"} & set(schema):
        return {"type": "regex", "pattern": "True|False"}
    if isinstance(schema, dict) and schema.get("type") == "null":
        return {"type": "const_string", "value": "None"}
    if isinstance(schema, dict) and definitions and "$ref" in json.dumps(schema):
        schema = {**definitions, **schema}  # its $refs point at the tool schema's root
    return {"type": "json_schema", "json_schema": schema}
