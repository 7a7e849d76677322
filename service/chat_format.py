"""The served model's chat format (its tool-call syntax and think markers) and what a request's
tools, tool choice, parallel tool calls and reasoning switches (ChatOptions) make of it: the
constraint the engine enforces, the chat template's variables, and how the output is read back
(OutputShape). Both front ends come through here.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from engine.sampling_params import SamplingParams
from grammar.chat.reasoning import ReasoningMarkers, markers_for_model
from grammar.chat.structural_tag import StructuralTagError
from grammar.chat.tool_calls import SYNTAXES, Tool, ToolCalls, syntax_for_model
from grammar.config import GRAMMAR_BACKENDS
from grammar.constraint import Constraint, after_thinking, with_tool_calls
from service.assistant_output import OutputShape
from service.errors import invalid_argument
from service.limits import ServiceLimits
from service.request import IN_REASONING_FIELD, THINK_FIELD, ChatOptions, PromptInput


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

    def plan(self, options: ChatOptions, constraint: Constraint | None, limits: ServiceLimits,
             think: Constraint | None = None) -> ToolPlan:
        """`think`: options.think_constraint as validation.think_constraint made it. Raises
        ServiceError (INVALID_ARGUMENT) naming the request field."""
        tools = _tools(options, limits)
        choice = _choice(options, tools)
        template_kwargs: dict[str, Any] = dict(options.template_kwargs)
        syntax = None
        if tools and choice != "none":
            calls = ToolCalls(tuple(tools), choice, options.tool_name, options.parallel_tool_calls, self.tool_syntax,
                              allowed=options.allowed_tools)
            if constraint is not None and constraint.kind == "structural_tag" and choice == "auto":
                _check_tags_beside_calls(calls, constraint)
            constraint = with_tool_calls(calls, constraint)
            syntax = calls.call_syntax  # typed by the tools' schemas where the syntax needs them
        reasoning = self._reasoning(options, template_kwargs)
        self._check_think(options, reasoning, think)
        if options.constraint_in_reasoning:
            _check_in_reasoning(options, constraint)
        elif reasoning is not None:
            constraint = after_thinking(constraint, reasoning.end, options.reasoning_budget or 0, think,
                                        reasoning.start)
        elif options.reasoning_budget is not None:
            raise invalid_argument("reasoning.budget_tokens", "needs reasoning on (a model with think markers)")
        constraint = _with_grammar_backend(constraint, options.grammar_backend)
        if constraint is not None:
            try:
                constraint.validate()
            except ValueError as e:
                raise invalid_argument("tools" if tools else "constraint", str(e)) from None
        template_tools = [_template_tool(t) for t in tools] or None
        shape = OutputShape(syntax, reasoning, think_if_opened=options.constraint_in_reasoning)
        return ToolPlan(constraint, shape, template_tools, template_kwargs)

    def render(self, options: ChatOptions, prompt: PromptInput, limits: ServiceLimits) -> PromptInput:
        """A chat `prompt` with the request's tools and think switch, as `plan` renders it for
        a generation (tokenizing: the same token counts). Raises ServiceError as `plan` does."""
        template_kwargs: dict[str, Any] = dict(options.template_kwargs)
        self._reasoning(options, template_kwargs)
        template_tools = [_template_tool(t) for t in _tools(options, limits)] or None
        return ToolPlan(None, OutputShape(), template_tools, template_kwargs).prompt(prompt)

    def _check_think(self, options: ChatOptions, reasoning: ReasoningMarkers | None,
                     think: Constraint | None) -> None:
        """A think constraint needs a think section, and no budget that would cut it short."""
        if think is None:
            return
        if self.reasoning is None:
            raise invalid_argument(THINK_FIELD, "this model has no think markers (the server's --think-markers "
                                                "START,END sets them)")
        if reasoning is None:
            raise invalid_argument(THINK_FIELD, "needs reasoning on (reasoning.enabled is false)")
        if options.reasoning_budget:
            raise invalid_argument(THINK_FIELD, "cannot be combined with reasoning.budget_tokens: a token budget "
                                                "is enforced only over free text (the grammar backends cap no "
                                                "grammar's tokens), and the end marker forced at the budget would "
                                                "cut the think text off mid-grammar, unmatched; bound the think "
                                                "constraint itself, e.g. a regex with a count or a maxLength")

    def _reasoning(self, options: ChatOptions, template_kwargs: dict[str, Any]) -> ReasoningMarkers | None:
        """The markers of the think section the output starts with (None: none), with the template
        variables that switch it set in `template_kwargs`."""
        wanted = options.thinking
        if self.reasoning is None:
            # a template variable sent as such (vLLM's chat_template_kwargs) is the template's to read
            if wanted and "enable_thinking" not in options.template_kwargs:
                raise invalid_argument("reasoning.enabled", "this model has no think markers (the server's "
                                                            "--think-markers START,END sets them)")
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


def _check_tags_beside_calls(calls: ToolCalls, constraint: Constraint) -> None:
    """A structural tag whose triggers and tags join the calls': none may clash with theirs."""
    try:
        dataclasses.replace(calls, answer={"kind": "structural_tag", "spec": constraint.spec}).validate()
    except StructuralTagError as e:
        raise invalid_argument(f"constraint.structural_tag.{e.path}", e.problem) from None


# the switch as both wires name it (an error names the other field first)
_IN_REASONING_NAMES = f"{IN_REASONING_FIELD} (HTTP: structured_outputs.enable_in_reasoning)"


def _check_in_reasoning(options: ChatOptions, constraint: Constraint | None) -> None:
    """A constraint over the whole output leaves no free think section to bound or constrain."""
    if constraint is None:
        raise invalid_argument(IN_REASONING_FIELD, "needs an output constraint (or tools) to cover the whole "
                                                   "output")
    if options.reasoning_budget is not None:
        raise invalid_argument("reasoning.budget_tokens", f"cannot be combined with {_IN_REASONING_NAMES} (the "
                                                          "constraint covers the think section too; bound it there)")
    if options.think_constraint is not None:
        raise invalid_argument(THINK_FIELD, f"cannot be combined with {_IN_REASONING_NAMES} (one constraint "
                                            "covers the whole output, think section included)")


def _tools(options: ChatOptions, limits: ServiceLimits) -> list[Tool]:
    tools = []
    num_bytes = 0
    for index, tool in enumerate(options.tools):
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


def _choice(options: ChatOptions, tools: list[Tool]) -> str:
    """"none", "auto", "required" or "named" (options.tool_name)."""
    if options.tool_choice == "named" and options.tool_name not in {t.name for t in tools}:
        raise invalid_argument("tool_choice.function_name", f"{options.tool_name!r} is not one of the request's tools")
    if options.tool_choice == "required" and not tools:
        raise invalid_argument("tool_choice", "required needs at least one tool")
    names = {t.name for t in tools}
    for index, name in enumerate(options.allowed_tools):
        if name not in names:
            raise invalid_argument(f"tool_choice.allowed_tools.function_names[{index}]",
                                   f"{name!r} is not one of the request's tools")
    if options.allowed_tools and options.tool_choice not in ("auto", "required"):
        raise invalid_argument("tool_choice.allowed_tools.mode", "must be auto or required")
    return options.tool_choice


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


def _with_grammar_backend(constraint: Constraint | None, backend: str | None) -> Constraint | None:
    """`constraint` (the output's, the tools' calls, the think section's: one grammar) compiled by
    the request's `backend` (ChatOptions.grammar_backend), which a constraint's own choice may only repeat."""
    if backend is None:
        return constraint
    if backend not in GRAMMAR_BACKENDS:
        raise invalid_argument("grammar_backend", f"unknown grammar backend {backend!r}; expected one of "
                                                  f"{', '.join(GRAMMAR_BACKENDS)}")
    if constraint is None:
        raise invalid_argument("grammar_backend", "needs a grammar to choose for: an output constraint, tools, or "
                                                  "reasoning with a budget or a think constraint")
    if constraint.grammar_backend and constraint.grammar_backend != backend:
        raise invalid_argument("grammar_backend", f"is {backend!r}, but constraint.grammar_backend is "
                                                  f"{constraint.grammar_backend!r}: set one of them")
    return msgspec.structs.replace(constraint, grammar_backend=backend)
