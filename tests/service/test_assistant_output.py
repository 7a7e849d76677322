"""Reading an assistant's output back: think sections, tool calls in each family's syntax, and the
streamed deltas, which must add up to the whole answer without ever taking text back."""
from __future__ import annotations

import json

import pytest

from grammar.chat.reasoning import ReasoningMarkers, split_reasoning
from grammar.chat.tool_calls import SYNTAXES, ToolCallSyntax, syntax_for_model
from service.assistant_output import AssistantStream, OutputShape, split

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
    """(reasoning, content, [(id, name, arguments)]) as a client adds up the streamed deltas."""
    reader = AssistantStream(shape)
    reasoning, content, calls = "", "", []
    for end in range(chunk, len(text) + chunk, chunk):
        parts = reader.step(text[:end], finished=end >= len(text))
        reasoning += parts.reasoning
        content += parts.content
        for delta in parts.call_deltas:
            if delta.id:
                assert delta.index == len(calls) and delta.arguments == ""
                calls.append([delta.id, delta.name, ""])
            else:
                assert not delta.name and delta.arguments
                calls[delta.index][2] += delta.arguments
    return reasoning, content, [tuple(c) for c in calls]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_streamed_parts_add_up_to_the_whole(chunk):
    shape = OutputShape(HERMES, THINK)
    text = "<think>\nCall the tool.\n</think>\n\nOne moment. " + CALL + "\n" + CALL.replace("Paris", "Oslo")
    whole = split(text, shape)
    reasoning, content, calls = stream(text, shape, chunk)
    assert reasoning == whole.reasoning == "Call the tool.\n"
    assert content.strip() == whole.content == "One moment."
    assert [(name, arguments) for _, name, arguments in calls] == [(c.name, c.arguments) for c in whole.calls]
    assert [json.loads(arguments)["city"] for _, _, arguments in calls] == ["Paris", "Oslo"]


@pytest.mark.parametrize("name", sorted(n for n, s in SYNTAXES.items() if isinstance(s, ToolCallSyntax)))
@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_every_json_syntax_streams_the_arguments_as_written(name, chunk):
    """The arguments add up to the text the model wrote (its own spacing), as the whole answer has them."""
    syntax = SYNTAXES[name]
    first = syntax.call_prefix("get_weather") + '{"city":"Paris", "days" : 3}}'
    second = syntax.call_prefix("get_time") + '{"zone": "CET"}}'
    written = (syntax.open + first + syntax.separator + second + syntax.close if syntax.wrapped
               else syntax.open + first + syntax.close + syntax.separator + syntax.open + second + syntax.close)
    text = "Checking. " + written
    shape = OutputShape(syntax)
    _, content, calls = stream(text, shape, chunk)
    whole = split(text, shape)
    assert content.strip() == whole.content == "Checking."
    assert [(n, a) for _, n, a in calls] == [(c.name, c.arguments) for c in whole.calls] == [
        ("get_weather", '{"city":"Paris", "days" : 3}'), ("get_time", '{"zone": "CET"}')]


def test_a_call_streams_its_name_first_then_its_arguments():
    reader = AssistantStream(OutputShape(HERMES))
    assert reader.step("Sure. <tool", finished=False).content == "Sure. "
    assert reader.step("Sure. " + CALL[:30], finished=False).call_deltas == []  # the name is not complete
    name_end = CALL.index('"arguments": ') + len('"arguments": ')
    parts = reader.step("Sure. " + CALL[:name_end], finished=False)
    [opening] = parts.call_deltas
    assert (opening.index, opening.name, opening.arguments) == (0, "get_weather", "")
    assert opening.id.startswith("call_") and parts.content == ""
    assert [d.arguments for d in reader.step("Sure. " + CALL[:name_end + 9], finished=False).call_deltas] == [
        '{"city": ']
    parts = reader.step("Sure. " + CALL, finished=False)
    assert [d.arguments for d in parts.call_deltas] == ['"Paris"}'] and parts.content == ""
    assert reader.num_calls == 1
    assert reader.final_parts("Sure. " + CALL).calls[0].id == opening.id  # the final answer keeps the ids


def test_a_call_cut_by_max_tokens_stays_a_call_once_streamed():
    reader = AssistantStream(OutputShape(HERMES))
    cut = "Sure. " + CALL[:CALL.index("Paris")]
    reader.step(cut, finished=False)
    parts = reader.step(cut + "Pa", finished=True)
    assert parts.content == "" and [d.arguments for d in parts.call_deltas] == ["Pa"]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_qwen3_coder_calls_stream_as_json_arguments_that_add_up_to_the_whole(chunk):
    from grammar.chat.tool_calls import Tool, ToolCalls
    tools = (Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"},
                                                                      "days": {"type": "integer"}}}),
             Tool("get_time", "", {"type": "object", "properties": {"zone": {"type": "string"}}}))
    syntax = ToolCalls(tools, syntax="qwen3_coder").call_syntax
    text = "Checking.\n" + syntax.render([("get_weather", {"city": "Paris\n</b>", "days": 3}),
                                          ("get_time", {"zone": "CET"})])
    shape = OutputShape(syntax)
    _, content, calls = stream(text, shape, chunk)
    whole = split(text, shape)
    assert content.strip() == whole.content == "Checking."
    assert [(n, a) for _, n, a in calls] == [(c.name, c.arguments) for c in whole.calls] == [
        ("get_weather", '{"city": "Paris\\n</b>", "days": 3}'), ("get_time", '{"zone": "CET"}')]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("name", ["pythonic", "tool_code"])
def test_pythonic_calls_stream_whole_arguments_that_add_up_to_the_whole(chunk, name):
    syntax = SYNTAXES[name]
    text = "Sure. " + syntax.render([("get_weather", {"city": "Paris, (FR)", "days": 3}),
                                     ("get_time", {"zone": "CET"})])
    shape = OutputShape(syntax)
    _, content, calls = stream(text, shape, chunk)
    whole = split(text, shape)
    assert content.strip() == whole.content == "Sure."
    assert [(n, a) for _, n, a in calls] == [(c.name, c.arguments) for c in whole.calls] == [
        ("get_weather", '{"city": "Paris, (FR)", "days": 3}'), ("get_time", '{"zone": "CET"}')]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_a_whole_output_constraint_reads_a_think_section_only_when_it_opens_with_one(chunk):
    shape = OutputShape(None, THINK, think_if_opened=True)
    opened = "<think>\nsteps\n</think>\n\n{\"a\": 1}"
    assert (split(opened, shape).reasoning, split(opened, shape).content) == ("steps\n", '{"a": 1}')
    assert stream(opened, shape, chunk)[:2] == ("steps\n", '{"a": 1}')
    plain = '{"a": 1}'  # no think section written: all of it is the answer, never reasoning
    assert (split(plain, shape).reasoning, split(plain, shape).content) == ("", plain)
    assert stream(plain, shape, chunk)[:2] == ("", plain)
    assert (split("<th", shape).reasoning, split("<th", shape).content) == ("", "<th")
    assert stream("<th", shape, chunk)[:2] == ("", "<th")


def test_a_whole_output_constraint_holds_back_only_a_possible_start_marker():
    reader = AssistantStream(OutputShape(None, THINK, think_if_opened=True))
    assert reader.step("<thi", False).content == ""
    assert reader.step("<tab", False).content == "<tab"


def test_a_structural_tags_parts_stay_in_content_beside_parsed_calls():
    text = "Sure. <note>check the sky</note> " + CALL
    parts = split(text, OutputShape(HERMES))
    assert parts.content == "Sure. <note>check the sky</note>"
    assert [(c.name, json.loads(c.arguments)) for c in parts.calls] == [("get_weather", {"city": "Paris"})]
