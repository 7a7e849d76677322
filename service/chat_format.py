"""The served model's chat format (its tool-call syntax and think markers) and what a request's
`tools`, `tool_choice`, `parallel_tool_calls` and `reasoning` fields make of it: the constraint the
engine enforces, the chat template's variables, and how the output is read back (OutputShape).

Both front ends come through here: HTTP translates its fields into the gRPC ones first.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from engine.sampling_params import SamplingParams
from grammar.chat.reasoning import ReasoningMarkers, markers_for_model
from grammar.chat.tool_calls import SYNTAXES, Tool, ToolCalls, ToolCallSyntax, syntax_for_model
from grammar.constraint import Constraint, after_thinking, with_tool_calls
from service._gen.formwork.v1 import generation_pb2 as pb
from service.errors import invalid_argument

if TYPE_CHECKING:
    from service.conversion import PromptInput
    from service.limits import ServiceLimits

@dataclass(frozen=True)
class OutputShape:
    """How one request's output is read back (service/assistant_output.py)."""

    tool_syntax: ToolCallSyntax | None = None  # set: calls are parsed out of the answer
    reasoning: ReasoningMarkers | None = None  # set: the output starts with a think section

    @property
    def plain(self) -> bool:
        return self.tool_syntax is None and self.reasoning is None


@dataclass(frozen=True)
class ToolPlan:
    """A request's tools and reasoning, resolved against the model's chat format."""

    constraint: Constraint | None
    shape: OutputShape
    tools: list[dict[str, Any]] | None = None  # for the chat template, in transformers' function shape
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """`params` with this plan's constraint."""
        if self.constraint is params.constraint:
            return params
        return msgspec.structs.replace(params, constraint=self.constraint)

    def prompt(self, prompt: PromptInput) -> PromptInput:
        """A chat `prompt` with this plan's tools and template variables."""
        if prompt.messages is None or not (self.tools or self.template_kwargs):
            return prompt
        return dataclasses.replace(prompt, tools=self.tools, template_kwargs=self.template_kwargs)


@dataclass(frozen=True)
class ChatFormat:
    tool_syntax: str = "hermes"  # a grammar.chat.tool_calls.SYNTAXES name
    reasoning: ReasoningMarkers | None = None  # None: the model does not think
    switches_thinking: bool = False  # its template reads enable_thinking

    @classmethod
    def for_model(cls, model_dir: str | None, chat_template: str | None, limits: ServiceLimits) -> ChatFormat:
        """The family's defaults (config.json's model_type, the template), with the server's overrides."""
        model_type = _model_type(model_dir)
        syntax = limits.tool_call_syntax or syntax_for_model(model_type, chat_template)
        reasoning = markers_for_model(model_type, chat_template)
        if limits.think_end:
            reasoning = ReasoningMarkers(limits.think_start, limits.think_end)
        elif limits.no_reasoning:
            reasoning = None
        return cls(syntax, reasoning, "enable_thinking" in (chat_template or ""))

    def plan(self, request: pb.GenerateRequest, constraint: Constraint | None, limits: ServiceLimits) -> ToolPlan:
        """Raises ServiceError (INVALID_ARGUMENT) naming the request field."""
        tools = _tools(request, limits)
        choice, name = _choice(request, tools)
        template_kwargs: dict[str, Any] = {}
        syntax = None
        if tools and choice != "none":
            parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
            constraint = with_tool_calls(ToolCalls(tuple(tools), choice, name, parallel, self.tool_syntax), constraint)
            syntax = SYNTAXES[self.tool_syntax]
        reasoning = self._reasoning(request, template_kwargs)
        if reasoning is not None:
            budget = request.reasoning.budget_tokens if request.HasField("reasoning") else 0
            constraint = after_thinking(constraint, reasoning.end, budget)
        elif request.HasField("reasoning") and request.reasoning.HasField("budget_tokens"):
            raise invalid_argument("reasoning.budget_tokens", "needs reasoning on (a model with think markers)")
        if constraint is not None:
            try:
                constraint.validate()
            except ValueError as e:
                raise invalid_argument("tools" if tools else "constraint", str(e)) from None
        template_tools = [_template_tool(t) for t in tools] or None
        return ToolPlan(constraint, OutputShape(syntax, reasoning), template_tools, template_kwargs)

    def render(self, request: pb.TokenizeRequest, prompt: PromptInput, limits: ServiceLimits) -> PromptInput:
        """A chat `prompt` with the request's tools and think switch, as `plan` renders it for
        Generate (Tokenize: the same token counts). Raises ServiceError as `plan` does."""
        template_kwargs: dict[str, Any] = {}
        self._reasoning(request, template_kwargs)
        template_tools = [_template_tool(t) for t in _tools(request, limits)] or None
        return ToolPlan(None, OutputShape(), template_tools, template_kwargs).prompt(prompt)

    def _reasoning(self, request: pb.GenerateRequest | pb.TokenizeRequest,
                   template_kwargs: dict[str, Any]) -> ReasoningMarkers | None:
        wanted = request.reasoning.enabled if request.reasoning.HasField("enabled") else None
        if self.reasoning is None:
            if wanted:
                raise invalid_argument("reasoning.enabled", "this model has no think markers (the server's "
                                                            "--think-end sets them)")
            return None
        if wanted is False:
            if not self.switches_thinking:
                raise invalid_argument("reasoning.enabled", "this model's chat template cannot switch thinking "
                                                            "off (it has no enable_thinking)")
            template_kwargs["enable_thinking"] = False
            return None
        if self.switches_thinking:
            template_kwargs["enable_thinking"] = True
        return self.reasoning


def _tools(request: pb.GenerateRequest | pb.TokenizeRequest, limits: ServiceLimits) -> list[Tool]:
    tools = []
    num_bytes = 0
    for index, tool in enumerate(request.tools):
        parameters = None
        if tool.parameters_json:
            num_bytes += len(tool.parameters_json.encode())
            try:
                parameters = json.loads(tool.parameters_json)
            except json.JSONDecodeError as e:
                raise invalid_argument(f"tools[{index}].parameters_json", f'("{tool.name}") is not valid JSON: {e}') \
                    from None
            if not isinstance(parameters, (dict, bool)):
                raise invalid_argument(f"tools[{index}].parameters_json",
                                       f'("{tool.name}") must be a JSON Schema object')
        tools.append(Tool(tool.name, tool.description, parameters))
    if num_bytes > limits.max_constraint_bytes:
        raise invalid_argument("tools", f"the tools' schemas are {num_bytes} bytes; this server's "
                                        f"max_constraint_bytes is {limits.max_constraint_bytes}")
    try:
        if tools:
            ToolCalls(tuple(tools)).validate()
    except ValueError as e:
        raise invalid_argument("tools", str(e)) from None
    return tools


def _choice(request: pb.GenerateRequest, tools: list[Tool]) -> tuple[str, str]:
    """("none" | "auto" | "required" | "named", the named tool)."""
    which = request.tool_choice.WhichOneof("choice") if request.HasField("tool_choice") else None
    if which == "function_name":
        name = request.tool_choice.function_name
        if name not in {t.name for t in tools}:
            raise invalid_argument("tool_choice.function_name", f"{name!r} is not one of the request's tools")
        return "named", name
    mode = request.tool_choice.mode if which == "mode" else pb.TOOL_CHOICE_MODE_UNSPECIFIED
    if mode in (pb.TOOL_CHOICE_MODE_UNSPECIFIED, pb.TOOL_CHOICE_MODE_AUTO):
        return "auto", ""
    if mode == pb.TOOL_CHOICE_MODE_NONE:
        return "none", ""
    if mode == pb.TOOL_CHOICE_MODE_REQUIRED:
        if not tools:
            raise invalid_argument("tool_choice", "required needs at least one tool")
        return "required", ""
    raise invalid_argument("tool_choice.mode", f"unknown value {mode}")


def _template_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.schema}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _model_type(model_dir: str | None) -> str | None:
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None
