"""Named and required tool choice on the real default model: every call parses, names an allowed
tool, and its arguments validate against that tool's schema (greedy and sampled)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from engine.frontend.tool_prompt import messages_with_tools
from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.chat.reasoning import ReasoningMarkers, split_reasoning
from grammar.chat.tool_calls import SYNTAXES, Tool, ToolCalls
from grammar.constraint import Constraint

pytestmark = pytest.mark.slow

TOOLS = (
    Tool("get_weather", "Current weather for a city",
         {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"]}),
    Tool("book_table", "Book a restaurant table",
         {"type": "object", "properties": {"restaurant": {"type": "string", "maxLength": 30},
                                           "people": {"type": "integer", "minimum": 1, "maximum": 20}},
          "required": ["restaurant", "people"]}),
)
THINK = ReasoningMarkers("<think>", "</think>")
QUESTIONS = ["What is the weather in Lisbon right now?", "Book a table for four at Chez Panisse.",
             "Is it raining in Tokyo?"]


def prompt(llm, question: str, syntax: str) -> dict:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                "parameters": t.parameters}} for t in TOOLS]
    messages = messages_with_tools([{"role": "user", "content": question}], tools, SYNTAXES[syntax])
    return {"prompt_token_ids": llm.tokenizer.encode_chat(messages)}


@pytest.mark.parametrize("choice, name, syntax", [
    ("required", "", "hermes"), ("named", "book_table", "hermes"), ("required", "", "mistral"),
    ("required", "", "qwen3_coder"), ("required", "", "pythonic"), ("required", "", "phi4_mini"),
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_call_parses_names_an_allowed_tool_and_validates(llm, choice, name, syntax, temperature):
    spec = ToolCalls(TOOLS, choice, name, parallel=False, syntax=syntax)
    params = SamplingParams(max_tokens=160, temperature=temperature, seed=7,
                            constraint=Constraint("tool_calls", spec.to_spec()))
    schemas = {t.name: t.parameters for t in spec.allowed_tools}
    outputs = llm.generate([prompt(llm, q, syntax) for q in QUESTIONS], params)
    for output in outputs:
        assert output.finish_reason == FinishReason.STOP, (output.error, output.text)
        content, calls = spec.call_syntax.parse(output.text)
        assert len(calls) == 1, output.text  # parallel calls off: one call, then the grammar ends
        assert content == ""  # only calls, from the first token
        for tool_name, arguments in calls:
            assert tool_name in schemas
            jsonschema.validate(json.loads(arguments), schemas[tool_name])


def test_a_think_budget_forces_the_end_marker_then_the_answer_is_constrained(llm):
    """SmolLM2 never writes </think> by itself: the budget makes it, and the schema follows."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    params = SamplingParams(max_tokens=64, temperature=0, constraint=Constraint(
        "json_schema", json.dumps(schema), think_end="</think>", think_budget=6))
    [output] = llm.generate([[{"role": "user", "content": "Where is the Eiffel Tower? Answer in JSON."}]], params)
    assert output.finish_reason == FinishReason.STOP, output.text
    reasoning, answer, ended = split_reasoning(output.text, THINK)
    assert ended and reasoning
    jsonschema.validate(json.loads(answer), schema)
    assert len(llm.tokenizer.encode(output.text.split("</think>")[0], add_special_tokens=False)) <= 7


def test_tool_calls_after_a_think_section(llm):
    spec = ToolCalls(TOOLS, "required", parallel=False)
    params = SamplingParams(max_tokens=120, temperature=0, constraint=Constraint(
        "tool_calls", spec.to_spec(), think_end="</think>", think_budget=4))
    [output] = llm.generate([prompt(llm, QUESTIONS[0], "hermes")], params)
    _, answer, ended = split_reasoning(output.text, THINK)
    assert ended and output.finish_reason == FinishReason.STOP, output.text
    content, [(name, arguments)] = SYNTAXES["hermes"].parse(answer)
    assert content == ""
    jsonschema.validate(json.loads(arguments), {t.name: t.parameters for t in TOOLS}[name])


def test_offline_chat_with_tools_renders_them_and_reads_the_calls_back(llm):
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                "parameters": t.parameters}} for t in TOOLS]
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS[:2]]
    answers = llm.chat(conversations, SamplingParams(max_tokens=120, temperature=0), tools=tools,
                       tool_choice="required", parallel_tool_calls=False)
    schemas = {t.name: t.parameters for t in TOOLS}
    for answer in answers:
        assert answer.output.finish_reason == FinishReason.STOP, answer.output.text
        [(name, arguments)] = answer.tool_calls
        assert answer.content == ""
        jsonschema.validate(json.loads(arguments), schemas[name])
    # the same prompt the server renders: the tools are in it
    assert answers[0].output.num_prompt_tokens == len(prompt(llm, QUESTIONS[0], "hermes")["prompt_token_ids"])
    [named] = llm.chat(conversations[0], SamplingParams(max_tokens=120, temperature=0), tools=tools,
                       tool_choice="book_table", parallel_tool_calls=False)
    assert [name for name, _ in named.tool_calls] == ["book_table"]
    with pytest.raises(ValueError, match="not one of the tools"):
        llm.chat(conversations[0], tools=tools, tool_choice="nope")
    [free] = llm.chat(conversations[0], SamplingParams(max_tokens=8, temperature=0), tools=tools, tool_choice="none")
    assert free.tool_calls == [] and free.content == free.output.text
