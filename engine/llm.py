"""The offline API: `LLM().generate(prompts, params)` and `LLM().chat(conversations, params,
tools=...)`, the same engine the server runs, in-process."""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

import msgspec

from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.frontend.output_processor import OutputProcessor, RequestOutput
from engine.frontend.tokenizer import Tokenizer
from engine.frontend.tool_prompt import render_inputs
from engine.protocol import EngineCoreRequest
from engine.sampling_params import SamplingParams
from grammar.chat.reasoning import markers_for_model, split_reasoning
from grammar.chat.tool_calls import SYNTAXES, Tool, ToolCalls, syntax_for_model
from grammar.constraint import after_thinking, with_tool_calls

# a prompt: raw text, a chat conversation (rendered with the chat template), or token ids
Prompt = Union[str, list[dict], dict]


@dataclass
class ChatOutput:
    """A chat answer read back: the think section, the text outside the calls, and the calls."""

    output: RequestOutput  # the whole output (text, token ids, finish_reason, ...)
    content: str
    reasoning: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (tool name, arguments as JSON text)


class LLM:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 grammar_backend: str | None = None, quantization: str | None = None) -> None:
        """`grammar_backend`: the engine's default grammar library (GrammarConfig.grammar_backend);
        `quantization`: "int8" (see EngineConfig.quantization)."""
        config = config or EngineConfig()
        if model is not None:
            config = replace(config, model=model)
        if grammar_backend is not None:
            config = replace(config, grammar=replace(config.grammar, grammar_backend=grammar_backend))
        if quantization is not None:
            config = replace(config, quantization=quantization)
        self.engine = EngineCore(config)
        self.tokenizer = Tokenizer.from_model_dir(self.engine.model_dir)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ValueError("a dict prompt needs 'prompt_token_ids'")
            return list(prompt["prompt_token_ids"])
        if isinstance(prompt, list):
            return self.tokenizer.encode_chat(prompt)
        raise ValueError(f"a prompt is a string, a list of chat messages or a dict, not {type(prompt).__name__}")

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order.

        Every request is validated before any is queued: one bad prompt or parameter raises
        ValueError (naming it and its index) and nothing runs.
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict)
                                                and "role" in prompts[0]):
            prompts = [prompts]  # one prompt, not a batch
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} SamplingParams")
        requests = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list)):
            try:
                request = EngineCoreRequest(f"offline-{next(self._ids)}", self.encode_prompt(prompt), p,
                                            arrival_time=time.monotonic())
                self.engine.validate_request(request)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
            requests.append(request)
        for request in requests:
            self.output_processor.add_request(request.request_id, request.prompt_token_ids,
                                              request.sampling_params, request.arrival_time, stream=False)
            self.engine.add_request(request)
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(requests):
            outputs, to_abort = self.output_processor.process_outputs(self.engine.step())
            if to_abort:
                self.engine.abort_requests(to_abort)
            for out in outputs:
                if out.finished:
                    finished[out.request_id] = out
            self.engine.outputs_delivered()
        return [finished[r.request_id] for r in requests]

    def chat(self, conversations: list[dict] | Sequence[list[dict]], params: SamplingParams | None = None, *,
             tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: str | Mapping[str, Any] = "auto",
             parallel_tool_calls: bool = True, reasoning_budget: int = 0) -> list[ChatOutput]:
        """Answer each conversation (one, or a list of them) as the server's chat does.

        `tools` in OpenAI's shape ({"type": "function", "function": {"name", "description",
        "parameters"}}) or flat ({"name", "description", "parameters"}) render through the chat
        template (or the tool prompt); `tool_choice` "auto" / "required" / "none" / a tool's name
        (or {"type": "function", "function": {"name": ...}}) constrains the calls as the server
        does, beside `params.constraint`. A model with think markers (its family's) thinks first,
        at most `reasoning_budget` tokens (0: no limit). ValueError names a bad tool or choice.
        """
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        params = params or SamplingParams()
        template = self.tokenizer.chat_template
        model_type = _model_type(self.engine.model_dir)
        syntax = SYNTAXES[syntax_for_model(model_type, template)]
        offered = [_tool(t, i) for i, t in enumerate(tools or ())]
        choice, name = _tool_choice(tool_choice)
        constraint = params.constraint
        reads_calls = bool(offered) and choice != "none"
        if reads_calls:
            spec = ToolCalls(tuple(offered), choice, name, parallel_tool_calls, syntax.name)
            spec.validate()
            constraint = with_tool_calls(spec, constraint)
            syntax = spec.call_syntax
        markers = markers_for_model(model_type, template)
        if markers is not None:
            constraint = after_thinking(constraint, markers.end, reasoning_budget)
        elif reasoning_budget:
            raise ValueError("reasoning_budget needs a model with think markers")
        if constraint is not params.constraint:
            params = msgspec.structs.replace(params, constraint=constraint)
        template_tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                            "parameters": t.schema}} for t in offered] or None
        prompts: list[Prompt] = []
        for messages in conversations:
            rendered, kwargs = render_inputs(list(messages), template_tools, template, syntax)
            prompts.append({"prompt_token_ids": self.tokenizer.encode_chat(rendered, **kwargs)})
        results = []
        for output in self.generate(prompts, params):
            reasoning, answer = "", output.text
            if markers is not None and constraint is not None:
                reasoning, answer, _ = split_reasoning(output.text, markers)
            content, calls = syntax.parse(answer) if reads_calls else (answer, [])
            results.append(ChatOutput(output, content, reasoning, calls))
        return results

    def shutdown(self) -> None:
        self.engine.shutdown()


def _tool(tool: Mapping[str, Any], index: int) -> Tool:
    function = tool.get("function", tool)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"tools[{index}] needs a name: {{'type': 'function', 'function': {{'name': ...}}}}")
    parameters = function.get("parameters")
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    return Tool(function["name"], function.get("description") or "", parameters)


def _tool_choice(choice: str | Mapping[str, Any]) -> tuple[str, str]:
    """("none" | "auto" | "required" | "named", the named tool)."""
    if isinstance(choice, Mapping):
        return "named", str((choice.get("function") or {}).get("name", ""))
    if choice in ("none", "auto", "required"):
        return choice, ""
    return "named", choice


def _model_type(model_dir) -> str | None:
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
