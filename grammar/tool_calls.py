"""Tool calls: the tools a request offers, the model family's call syntax, and reading calls back.

A `ToolCalls` spec is what a "tool_calls" Constraint carries (as JSON text in `Constraint.spec`):
the tools (name, description, JSON Schema of the arguments), the choice (auto / required / one
named tool), whether several calls may follow one another, and the syntax the model writes calls
in. The grammar side (grammar/xgrammar_backend/) turns it into a structural tag; the front end
reads calls back out of the text with `ToolCallSyntax.parse`. No grammar library is imported here.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CHOICES = ("auto", "required", "named")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class ToolCallSyntax:
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

    def call_prefix(self, tool_name: str) -> str:
        """The text of one call up to its arguments object."""
        return '{"name": ' + json.dumps(tool_name, ensure_ascii=False) + ', "' + self.args_key + '": '

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """`calls` ((name, arguments) pairs) as the model writes them."""
        bodies = [self.call_prefix(name) + json.dumps(arguments, ensure_ascii=False) + "}" for name, arguments in calls]
        if self.wrapped:
            return self.open + self.separator.join(bodies) + self.close
        return self.separator.join(self.open + body + self.close for body in bodies)

    def parse(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """(the text outside the calls, [(tool name, arguments as JSON text)]).

        A call that is not complete or does not parse stays in the text, so nothing the model
        wrote is lost; under a required/named constraint every call is complete and parses.
        """
        content, calls, _ = self.scan(text)
        return content.strip(), calls

    def scan(self, text: str) -> tuple[str, list[tuple[str, str]], int | None]:
        """(the text outside the calls, unstripped, with only separators between calls dropped;
        the calls; where a call begins that is not complete or does not parse, or None)."""
        calls: list[tuple[str, str]] = []
        kept: list[str] = []
        decoder = json.JSONDecoder()
        pos = 0
        broken = None
        while True:
            at = text.find(self.trigger, pos)
            if at < 0:
                break
            found = self._parse_at(text, at, decoder)
            if found is None:
                broken = at
                break
            end, parsed = found
            kept.append(text[pos:at])
            calls += parsed
            pos = end
        kept.append(text[pos:])
        return "".join(piece for piece in kept if piece.strip(" \n;,")), calls, broken

    def _parse_at(self, text: str, at: int, decoder: json.JSONDecoder) -> tuple[int, list[tuple[str, str]]] | None:
        opener = self.open.rstrip("[{\n ")  # the marker before the JSON value ("" for Llama's bare JSON)
        if not text.startswith(opener, at):
            return None
        pos = _skip_space(text, at + len(opener))
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        closer = self.close.strip("]}\n ")
        if closer:
            pos = _skip_space(text, pos)
            if not text.startswith(closer, pos):
                return None
            pos += len(closer)
        items = value if isinstance(value, list) else [value]
        calls = []
        for item in items:
            if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
                return None
            arguments = item.get(self.args_key, item.get("arguments", {}))
            calls.append((item["name"], json.dumps(arguments, ensure_ascii=False)))
        return pos, calls


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \n\t\r":
        pos += 1
    return pos


# the call syntaxes Formwork knows, by name
SYNTAXES: dict[str, ToolCallSyntax] = {s.name: s for s in (
    # Hermes / Qwen 2.5 / Qwen 3: each call in its own <tool_call> block
    ToolCallSyntax("hermes", open="<tool_call>\n", close="\n</tool_call>", separator="\n", args_key="arguments",
                   trigger="<tool_call>"),
    # Llama 3.1+ JSON tool calling: a bare JSON object (several separated by "; ")
    ToolCallSyntax("llama3_json", open="", close="", separator="; ", args_key="parameters", trigger='{"name": '),
    # Mistral: one [TOOL_CALLS] list holding every call
    ToolCallSyntax("mistral", open="[TOOL_CALLS][", close="]", separator=", ", args_key="arguments",
                   trigger="[TOOL_CALLS]", wrapped=True),
)}
DEFAULT_SYNTAX = "hermes"

# model family (config.json's model_type) -> its call syntax; families not listed use DEFAULT_SYNTAX
FAMILY_SYNTAX = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes",
    "mistral": "mistral", "mixtral": "mistral",
}


def syntax_for_model(model_type: str | None, chat_template: str | None) -> str:
    """The call syntax a model writes: by its family, or by what its chat template prints.

    Llama-architecture models are many families (SmolLM2 writes ChatML), so Llama 3's JSON calls
    are chosen by the template that teaches them (its ipython role), not by the architecture.
    """
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return FAMILY_SYNTAX.get(model_type or "", DEFAULT_SYNTAX)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: Any = None  # a JSON Schema (dict or bool); None: any JSON object

    @property
    def schema(self) -> Any:
        return {"type": "object"} if self.parameters is None else self.parameters


@dataclass(frozen=True)
class ToolCalls:
    """What a "tool_calls" constraint asks for. `choice`: "auto" (free text, and calls once the
    model starts one), "required" (only calls, at least one), or "named" (only calls of `name`)."""

    tools: tuple[Tool, ...]
    choice: str = "required"
    name: str = ""  # the tool, with choice "named"
    parallel: bool = True  # several calls in one turn
    syntax: str = DEFAULT_SYNTAX

    @property
    def call_syntax(self) -> ToolCallSyntax:
        return SYNTAXES[self.syntax]

    @property
    def allowed_tools(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if t.name == self.name) if self.choice == "named" else self.tools

    def to_spec(self) -> str:
        return json.dumps({"tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                                     for t in self.tools],
                           "choice": self.choice, "name": self.name, "parallel": self.parallel,
                           "syntax": self.syntax}, ensure_ascii=False)

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
        result = cls(tuple(tools), data.get("choice", "required"), data.get("name", ""),
                     bool(data.get("parallel", True)), data.get("syntax", DEFAULT_SYNTAX))
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
        if self.syntax not in SYNTAXES:
            raise ValueError(f"unknown tool call syntax {self.syntax!r}; expected one of {', '.join(SYNTAXES)}")
