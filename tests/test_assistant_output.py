"""Reading an assistant's output back: think sections, tool calls in each family's syntax, and the
streamed deltas, which must add up to the whole answer without ever taking text back."""
from __future__ import annotations

import json

import pytest

from grammar.reasoning import ReasoningMarkers, split_reasoning
from grammar.tool_calls import SYNTAXES, syntax_for_model
from service.assistant_output import AssistantStream, split
from service.chat_format import OutputShape

THINK = ReasoningMarkers("<think>", "</think>")
HERMES = SYNTAXES["hermes"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("name", sorted(SYNTAXES))
def test_render_and_parse_round_trip(name):
    syntax = SYNTAXES[name]
    calls = [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    content, parsed = syntax.parse("Checking. " + syntax.render(calls))
    assert content == "Checking."
    assert [(n, json.loads(a)) for n, a in parsed] == calls


def test_an_incomplete_or_broken_call_stays_text():
    assert HERMES.parse("Hi <tool_call>\n{\"name\": \"get_") == ('Hi <tool_call>\n{"name": "get_', [])
    assert HERMES.parse("<tool_call>\n[1, 2]\n</tool_call>")[1] == []


def test_split_reasoning():
    assert split_reasoning("<think>\nhmm\n</think>\n\n{}", THINK) == ("hmm\n", "{}", True)
    assert split_reasoning("no marker yet", THINK, finished=False) == ("no marker yet", "", False)
    assert split_reasoning("almost </thi", THINK, finished=False)[0] == "almost "
    assert split_reasoning("<thi", THINK, finished=False)[0] == ""


def test_family_syntax_defaults():
    assert syntax_for_model("qwen3", None) == "hermes"
    assert syntax_for_model("llama", "{{ '<|python_tag|>' }}") == "llama3_json"
    assert syntax_for_model("mistral", None) == "mistral"
    assert syntax_for_model("llama", "<|im_start|>") == "hermes"


def stream(text: str, shape: OutputShape, chunk: int):
    reader = AssistantStream(shape)
    reasoning, content, calls = "", "", []
    for end in range(chunk, len(text) + chunk, chunk):
        parts = reader.step(text[:end], finished=end >= len(text))
        reasoning += parts.reasoning
        content += parts.content
        calls += parts.calls
    return reasoning, content, calls


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_streamed_parts_add_up_to_the_whole(chunk):
    shape = OutputShape(HERMES, THINK)
    text = "<think>\nCall the tool.\n</think>\n\nOne moment. " + CALL + "\n" + CALL.replace("Paris", "Oslo")
    whole = split(text, shape)
    reasoning, content, calls = stream(text, shape, chunk)
    assert reasoning == whole.reasoning == "Call the tool.\n"
    assert content.strip() == whole.content == "One moment."
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]


def test_a_call_is_handed_out_only_once_complete():
    reader = AssistantStream(OutputShape(HERMES))
    assert reader.step("Sure. <tool", finished=False).content == "Sure. "
    assert reader.step("Sure. " + CALL[:30], finished=False).calls == []
    parts = reader.step("Sure. " + CALL, finished=False)
    assert [c.name for c in parts.calls] == ["get_weather"] and parts.content == ""
    assert reader.num_calls == 1
