"""Tool calls: the tools a request offers, the model family's call syntax, and reading calls back.

A `ToolCalls` spec is what a "tool_calls" Constraint carries (as JSON text in `Constraint.spec`):
the tools (name, description, JSON Schema of the arguments), the choice (auto / required / one
named tool), whether several calls may follow one another, and the syntax the model writes calls
in: JSON calls (`ToolCallSyntax`, here), Qwen3-Coder's XML parameters (xml_tool_calls.py), or
Python calls in Llama's pythonic list or Gemma's ```tool_code block (pythonic_tool_calls.py), each
with the same methods. Both backends build the calls' structural-tag format (tool_call_format.py);
the front end reads calls back out of the text with the syntax's `parse`. No grammar library is
imported here.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from grammar.chat.call_reader import CallReader, scan_calls, skip_space
from grammar.chat.pythonic_tool_calls import PythonicSyntax
from grammar.chat.structural_tag import Format, StructuralTagError, conflicting_trigger, parse_structural_tag
from grammar.chat.tool import CompileLeaf, Tool
from grammar.chat.xml_tool_calls import XmlParameterSyntax

TOOL_CHOICES = ("auto", "required", "named")
# the constraint kinds a text answer beside the calls may have (ToolCalls.answer)
ANSWER_KINDS = ("json_schema", "json_object", "regex", "grammar", "choice", "structural_tag")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class ToolCallSyntax(CallReader):
    """How one model family writes a call: `open`, then `{"name": "<tool>", "<args_key>": {...}}`,
    then `close`. With `wrapped`, open/close surround all the calls of one turn (Mistral's
    `[TOOL_CALLS][call, call]`); otherwise they surround each call. `trigger` is the text that
    starts the call section in free text (a prefix of `open`, or of the call itself)."""

    name: str
    open: str
    close: str
    separator: str  # between two calls
    args_key: str
    trigger: str
    wrapped: bool = False

    def for_tools(self, tools: tuple[Tool, ...] | list[Tool]) -> ToolCallSyntax:
        """This syntax reading calls of `tools` (a JSON call carries its own types)."""
        return self

    def call_tag(self, name: str, content: Format) -> Format:
        """One call of `name` as a format; `content`: its arguments (arguments_format)."""
        begin = self.call_prefix(name)
        return {"type": "tag", "begin": begin if self.wrapped else self.open + begin, "content": content,
                "end": "}" if self.wrapped else "}" + self.close}

    def arguments_format(self, tool: Tool, compile_leaf: CompileLeaf) -> tuple[Format, list[str], list[str]]:
        """(the arguments object as a format: the tool's schema, compiled by `compile_leaf(leaf,
        "")`; the narrowings chosen: none; the keywords not enforced beyond the schema's own: none)."""
        return compile_leaf({"type": "json_schema", "json_schema": tool.schema}, ""), [], []

    def closing_words(self, tool: Tool) -> list[str]:
        """Words that close a call of `tool` that a closing search may not spell a character at a
        time: none (a JSON call's ends are forced text)."""
        return []

    def raw_patterns(self, tool: Tool) -> list[str]:
        """The regexes of `tool`'s values written raw, not as JSON: none."""
        return []

    def call_prefix(self, tool_name: str) -> str:
        """The text of one call up to its arguments object."""
        return '{"name": ' + json.dumps(tool_name, ensure_ascii=False) + ', "' + self.args_key + '": '

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """`calls` ((name, arguments) pairs) as the model writes them."""
        bodies = [self.call_prefix(name) + json.dumps(arguments, ensure_ascii=False) + "}" for name, arguments in calls]
        if self.wrapped:
            return self.open + self.separator.join(bodies) + self.close
        return self.separator.join(self.open + body + self.close for body in bodies)

    def scan(self, text: str) -> tuple[str, list[tuple[str, str]], int | None]:
        """(the text outside the calls, unstripped, with only separators between calls dropped;
        the calls; where a call begins that is not complete or does not parse, or None)."""
        return scan_calls(text, self.trigger, partial(self._parse_at, decoder=json.JSONDecoder()), " \n;,")

    def _parse_at(self, text: str, at: int, decoder: json.JSONDecoder) -> tuple[int, list[tuple[str, str]]] | None:
        opener = self.open.rstrip("[{\n ")  # the marker before the JSON value ("" for Llama's bare JSON)
        if not text.startswith(opener, at):
            return None
        value_start = skip_space(text, at + len(opener))
        try:
            value, pos = decoder.raw_decode(text, value_start)
        except json.JSONDecodeError:
            return None
        value_end = pos
        closer = self.close.strip("]}\n ")
        if closer:
            pos = skip_space(text, pos)
            if not text.startswith(closer, pos):
                return None
            pos += len(closer)
        items = value if isinstance(value, list) else [value]
        calls = []
        cursor = value_start
        for item in items:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
                return None
            arguments, cursor = self._written_arguments(text, cursor, value_end, item, decoder)
            calls.append((item["name"], arguments))
        return pos, calls

    def _written_arguments(self, text: str, cursor: int, value_end: int, item: dict,
                           decoder: json.JSONDecoder) -> tuple[str, int]:
        """A parsed call's arguments as the model wrote them (so a stream of the text adds up to
        them), and where they end; re-serialized when the call is not in this syntax's shape."""
        prefix = self.call_prefix(item["name"])
        at = text.find(prefix, cursor, value_end)
        if at >= 0:
            start = at + len(prefix)
            try:
                end = decoder.raw_decode(text, start)[1]
                return text[start:end], end
            except json.JSONDecodeError:
                pass
        arguments = item.get(self.args_key, item.get("arguments", {}))
        return json.dumps(arguments, ensure_ascii=False), cursor

    def partial_calls(self, text: str, at: int) -> list[tuple[str, str]]:
        """The calls of a call section begun at `at` that `scan` found not complete yet: (name,
        the arguments text written so far), for streaming. A call whose name is not complete is
        left out; with `wrapped`, the complete calls before it in the same list come first."""
        opener = self.open.rstrip("[{\n ")
        if not text.startswith(opener, at):
            return []
        pos = skip_space(text, at + len(opener))
        if self.wrapped:
            if not text.startswith("[", pos):
                return []
            pos += 1
        start_of_call = re.compile(re.escape('{"name": "') + r'([^"\\]*)'
                                   + re.escape('", "' + self.args_key + '": '))
        decoder = json.JSONDecoder()
        calls: list[tuple[str, str]] = []
        while True:
            match = start_of_call.match(text, skip_space(text, pos))
            if match is None:
                return calls
            start = match.end()
            try:
                end = decoder.raw_decode(text, start)[1]
            except json.JSONDecodeError:
                calls.append((match.group(1), text[start:]))
                return calls
            calls.append((match.group(1), text[start:end]))
            pos = skip_space(text, end)
            if not (self.wrapped and text.startswith("}", pos)):
                return calls
            pos = skip_space(text, pos + 1)
            if not text.startswith(self.separator.strip(), pos):
                return calls
            pos += len(self.separator.strip())


# a family's call syntax: JSON calls, or calls with one XML-ish element per parameter
CallSyntax = ToolCallSyntax | XmlParameterSyntax | PythonicSyntax
# the call syntaxes Formwork knows, by name
SYNTAXES: dict[str, CallSyntax] = {s.name: s for s in (
    # Hermes / Qwen 2.5 / Qwen 3: each call in its own <tool_call> block
    ToolCallSyntax("hermes", open="<tool_call>\n", close="\n</tool_call>", separator="\n", args_key="arguments",
                   trigger="<tool_call>"),
    # Llama 3.1+ JSON tool calling: a bare JSON object (several separated by "; ")
    ToolCallSyntax("llama3_json", open="", close="", separator="; ", args_key="parameters", trigger='{"name": '),
    # Mistral: one [TOOL_CALLS] list holding every call
    ToolCallSyntax("mistral", open="[TOOL_CALLS][", close="]", separator=", ", args_key="arguments",
                   trigger="[TOOL_CALLS]", wrapped=True),
    # Phi-4-mini: one <|tool_call|> list holding every call
    ToolCallSyntax("phi4_mini", open="<|tool_call|>[", close="]<|/tool_call|>", separator=", ", args_key="arguments",
                   trigger="<|tool_call|>", wrapped=True),
    # Qwen3-Coder: <tool_call><function=NAME><parameter=ARG>value</parameter>...</function></tool_call>
    XmlParameterSyntax(),
    # Llama 3.2 / Llama 4's pythonic calls: [f(a=1, b="x"), g()]
    PythonicSyntax(),
    # Gemma's function calling: the same Python calls, one a line, in a ```tool_code block
    PythonicSyntax("tool_code", open="```tool_code\n", close="\n```", separator="\n", trigger="```tool_code"),
)}
DEFAULT_SYNTAX = "hermes"

# model family (config.json's model_type) -> its call syntax; families not listed use DEFAULT_SYNTAX
FAMILY_SYNTAX = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes",
    "mistral": "mistral", "mixtral": "mistral",
    # Gemma's templates hold no tools; Google's Gemma function-calling guides have the model write
    # its calls as Python in a ```tool_code block (and read results from a ```tool_output block)
    "gemma": "tool_code", "gemma2": "tool_code", "gemma3": "tool_code", "gemma3_text": "tool_code",
    "gemma3n": "tool_code",
}


def syntax_for_model(model_type: str | None, chat_template: str | None) -> str:
    """The call syntax a model writes: by its family, or by what its chat template prints.

    Llama-architecture models are many families (SmolLM2 writes ChatML), so Llama 3's JSON calls
    are chosen by the template that teaches them (its ipython role), not by the architecture.
    """
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|tool|>" in template or "<|tool_call|>" in template:  # Phi-4-mini's tool markers
        return "phi4_mini"
    if "[func_name" in template:  # the template teaches the pythonic list of calls
        return "pythonic"
    if "```tool_code" in template:  # a template that teaches Gemma's fenced calls
        return "tool_code"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return FAMILY_SYNTAX.get(model_type or "", DEFAULT_SYNTAX)


@dataclass(frozen=True)
class ToolCalls:
    """What a "tool_calls" constraint asks for. `choice`: "auto" (free text, and calls once the
    model starts one), "required" (only calls, at least one), or "named" (only calls of `name`).
    `allowed` (auto / required): the names of the only tools that may be called (empty: all); the
    other tools are still shown to the model.
    `answer` (auto only): the constraint a text answer follows instead of free text, as
    {"kind", "spec", "choices"}; the output is then either such an answer or only calls."""

    tools: tuple[Tool, ...]
    choice: str = "required"
    name: str = ""  # the tool, with choice "named"
    parallel: bool = True  # several calls in one turn
    syntax: str = DEFAULT_SYNTAX
    answer: dict[str, Any] | None = None
    allowed: tuple[str, ...] = ()

    @property
    def call_syntax(self) -> CallSyntax:
        return SYNTAXES[self.syntax].for_tools(self.tools)

    @property
    def allowed_tools(self) -> tuple[Tool, ...]:
        if self.choice == "named":
            return tuple(t for t in self.tools if t.name == self.name)
        if self.allowed:
            return tuple(t for t in self.tools if t.name in self.allowed)
        return self.tools

    def to_spec(self) -> str:
        return json.dumps({"tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                                     for t in self.tools],
                           "choice": self.choice, "name": self.name, "parallel": self.parallel,
                           "syntax": self.syntax, **({"answer": self.answer} if self.answer else {}),
                           **({"allowed": list(self.allowed)} if self.allowed else {})},
                          ensure_ascii=False)

    @classmethod
    def from_spec(cls, spec: str) -> ToolCalls:
        """Parse and check a spec; ValueError names the problem (and the tool, by index and name)."""
        try:
            data = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"tool_calls spec is not valid JSON: {e}") from None
        if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
            raise ValueError("tool_calls spec must be an object with a list of tools")
        tools = []
        for index, raw in enumerate(data["tools"]):
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise ValueError(f"tools[{index}] needs a string name")
            parameters = raw.get("parameters")
            if parameters is not None and not isinstance(parameters, (dict, bool)):
                raise ValueError(f'tools[{index}] "{raw["name"]}": parameters must be a JSON Schema object')
            tools.append(Tool(raw["name"], raw.get("description") or "", parameters))
        allowed = data.get("allowed", [])
        if not isinstance(allowed, list) or not all(isinstance(name, str) for name in allowed):
            raise ValueError("allowed must be a list of tool names")
        result = cls(tuple(tools), data.get("choice", "required"), data.get("name", ""),
                     bool(data.get("parallel", True)), data.get("syntax", DEFAULT_SYNTAX), data.get("answer"),
                     tuple(allowed))
        result.validate()
        return result

    def validate(self) -> None:
        if not self.tools:
            raise ValueError("tool calls need at least one tool")
        seen: set[str] = set()
        for index, tool in enumerate(self.tools):
            if not _TOOL_NAME.match(tool.name):
                raise ValueError(f"tools[{index}].name {tool.name!r} must be 1-64 letters, digits, '_', '.', ':' "
                                 "or '-'")
            if tool.name in seen:
                raise ValueError(f"tools[{index}].name {tool.name!r} is used by two tools")
            seen.add(tool.name)
        if self.choice not in TOOL_CHOICES:
            raise ValueError(f"unknown tool choice {self.choice!r}; expected one of {', '.join(TOOL_CHOICES)}")
        if self.choice == "named" and self.name not in seen:
            raise ValueError(f"tool_choice names {self.name!r}, which is not one of the tools")
        if self.allowed and self.choice not in ("auto", "required"):
            raise ValueError("allowed tools apply to tool choice auto or required")
        for index, name in enumerate(self.allowed):
            if name not in seen:
                raise ValueError(f"allowed[{index}] {name!r} is not one of the tools")
        if self.syntax not in SYNTAXES:
            raise ValueError(f"unknown tool call syntax {self.syntax!r}; expected one of {', '.join(SYNTAXES)}")
        if self.answer is not None:
            if self.choice != "auto":
                raise ValueError("an answer constraint applies to tool choice auto only (the other choices "
                                 "answer only with calls)")
            if not isinstance(self.answer, dict) or self.answer.get("kind") not in ANSWER_KINDS:
                raise ValueError(f"the answer constraint needs a kind, one of {', '.join(ANSWER_KINDS)}")
            if self.answer["kind"] == "structural_tag":
                self._check_tags_beside_calls(self.answer.get("spec", ""))

    def _check_tags_beside_calls(self, spec: str) -> None:
        """A structural tag beside the calls: well formed, and none of its triggers clashing
        with the call syntax's (StructuralTagError naming the trigger's path)."""
        tagged = parse_structural_tag(spec)
        trigger = self.call_syntax.trigger
        index = conflicting_trigger(tagged, trigger)
        if index is not None:
            older_shape = "format" not in json.loads(spec)
            raise StructuralTagError(f"{'' if older_shape else 'format.'}triggers[{index}]",
                                     f"{tagged['triggers'][index]!r} clashes with the tool calls' trigger "
                                     f"{trigger!r} ({self.syntax} syntax): one starts the other, so a call and a "
                                     f"tag could not be told apart; choose a trigger that neither starts nor "
                                     f"extends it")
