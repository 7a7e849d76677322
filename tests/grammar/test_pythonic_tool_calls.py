"""Llama 3.2's pythonic calls and Gemma's ```tool_code block: written as Python, read back as
OpenAI's arguments JSON (Python's and JSON's constants alike), streamed one whole argument at a
time, and the family found from its chat template. Library-free."""
from __future__ import annotations

import json

import pytest

from grammar.chat.tool_calls import SYNTAXES, syntax_for_model

SYNTAX = SYNTAXES["pythonic"]
CALLS = '[get_weather(city="Paris", days=3, metric=True), get_time(zone=\'CET\', at=None)]'


@pytest.mark.parametrize("arguments", [
    {"city": "Paris 'x' \"y\"\n", "days": -3, "ratio": 0.5},
    {"ok": True, "none": None, "nested": [True, {"a": None, "b": [1, "two)"]}]},
    {},
])
def test_render_and_parse_round_trip(arguments):
    text = SYNTAX.render([("f", arguments), ("g", {"x": "]"})])
    content, calls = SYNTAX.parse("Calling. " + text)
    assert content == "Calling."
    assert calls == [("f", json.dumps(arguments, ensure_ascii=False)), ("g", '{"x": "]"}')]


def test_python_and_json_constants_read_alike():
    assert SYNTAX.parse(CALLS)[1] == [("get_weather", '{"city": "Paris", "days": 3, "metric": true}'),
                                      ("get_time", '{"zone": "CET", "at": null}')]
    assert SYNTAX.parse('[f(a=true, b={"k": [null]})]')[1] == [("f", '{"a": true, "b": {"k": [null]}}')]


def test_brackets_in_text_are_text_and_broken_calls_stay_text():
    assert SYNTAX.parse("See [1, 2] and [the docs](x). " + CALLS)[0] == "See [1, 2] and [the docs](x)."
    assert SYNTAX.scan("See [1] and [f(a=1")[2] == len("See [1] and ")
    for broken in ("[f(a=1 b=2)]", "[f(1)]", "[f(a={1, 2})]", "[f(a=x)]"):
        assert SYNTAX.parse(broken) == (broken, []), broken


def test_partial_calls_stream_whole_arguments_that_grow_into_the_final_ones():
    final = [arguments for _, arguments in SYNTAX.parse(CALLS)[1]]
    seen: list[list[tuple[str, str]]] = []
    for end in range(1, len(CALLS)):
        _, calls, broken = SYNTAX.scan(CALLS[:end])
        assert calls == [] and broken == 0
        partial = SYNTAX.partial_calls(CALLS[:end], 0)
        for index, (_, arguments) in enumerate(partial):
            assert final[index].startswith(arguments)
        seen.append(partial)
    assert [] in seen and [("get_weather", "{")] in seen
    assert [("get_weather", '{"city": "Paris"')] in seen  # once its value is complete
    assert [("get_weather", '{"city": "Paris", "days": 3, "metric": true'), ("get_time", "{")] in seen


def test_the_chat_template_picks_the_syntax():
    template = ("{{- 'you MUST put it in the format of [func_name1(params_name1=params_value1, "
                "params_name2=params_value2...), func_name2(params)]' }}{{ 'ipython' }}")
    assert syntax_for_model("llama", template) == "pythonic"
    assert syntax_for_model("llama", "{{ '<|python_tag|>' }} ipython") == "llama3_json"
    assert syntax_for_model("gemma3", "<start_of_turn>") == "tool_code"  # Gemma's documented form
    assert syntax_for_model("gemma3_text", None) == "tool_code"
    assert syntax_for_model(None, "wrap calls in ```tool_code blocks") == "tool_code"


def test_phi4_mini_writes_one_json_list_between_its_markers():
    phi = SYNTAXES["phi4_mini"]
    text = phi.render([("f", {"a": 1}), ("g", {})])
    assert text == '<|tool_call|>[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]<|/tool_call|>'
    assert phi.parse("Sure. " + text) == ("Sure.", [("f", '{"a": 1}'), ("g", "{}")])
    assert phi.partial_calls(text[:-len("}}]<|/tool_call|>")], 0) == [("f", '{"a": 1}'), ("g", "{")]
    assert syntax_for_model("phi3", "{{ '<|tool|>' + tools + '<|/tool|>' }}") == "phi4_mini"


TOOL_CODE = SYNTAXES["tool_code"]
FENCED = '```tool_code\nget_weather(city="Paris", days=3)\nget_time(zone="CET")\n```'


def test_gemma_writes_its_calls_one_a_line_in_a_tool_code_block():
    assert TOOL_CODE.render([("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]) == FENCED
    assert TOOL_CODE.parse("Let me check.\n" + FENCED + "\nOne moment.") == (
        "Let me check.\n\nOne moment.", [("get_weather", '{"city": "Paris", "days": 3}'),
                                          ("get_time", '{"zone": "CET"}')])
    assert TOOL_CODE.parse('```tool_code\nnow()\n```')[1] == [("now", "{}")]


def test_gemma_code_that_is_not_calls_stays_text():
    for text in ("```tool_code\nx = 1\n```", "```python\nf(a=1)\n```", "```tool_code\nf(a=1); g(b=2)\n```"):
        assert TOOL_CODE.parse(text) == (text, []), text


def test_gemma_partial_blocks_stream_whole_arguments_and_hold_the_closing_fence():
    final = [arguments for _, arguments in TOOL_CODE.parse(FENCED)[1]]
    for end in range(1, len(FENCED)):
        _, calls, broken = TOOL_CODE.scan(FENCED[:end])
        if end >= len("```tool_code"):
            assert calls == [] and broken == 0, FENCED[:end]  # a call under way, the fence not closed yet
        for index, (_, arguments) in enumerate(TOOL_CODE.partial_calls(FENCED[:end], 0)):
            assert final[index].startswith(arguments)
    assert TOOL_CODE.partial_calls(FENCED[:-1], 0) == [("get_weather", final[0][:-1]), ("get_time", final[1][:-1])]
