"""Qwen3-Coder's XML-parameter calls: written and read back typed by the tool's schema, the
arguments streamed as written, and the family found from its chat template. Library-free."""
from __future__ import annotations

import json

import pytest

from grammar.chat.tool_calls import SYNTAXES, Tool, ToolCalls, syntax_for_model

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]},
    "zip": {"type": ["string", "null"]}, "tags": {"type": "array"}}, "required": ["city"]})
SYNTAX = ToolCalls((WEATHER,), syntax="qwen3_coder").call_syntax
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_render_writes_the_template_form():
    assert SYNTAX.render([("get_weather", {"city": "New York", "days": 3})]) == CALL
    assert SYNTAX.render([("get_weather", '{"city": "New York", "days": 3}')]) == CALL  # OpenAI's JSON text


@pytest.mark.parametrize("arguments", [
    {"city": "42"},  # a string that reads as JSON stays a string
    {"city": "a\n</parameter>x <b>", "days": -1},
    {"city": "", "unit": "f", "zip": None, "tags": [1, {"a": "b"}]},
    {"city": "Oslo", "zip": "0150"},
])
def test_values_round_trip_typed_by_the_schema(arguments):
    content, calls = SYNTAX.parse("Checking.\n" + SYNTAX.render([("get_weather", arguments)] * 2))
    assert content == "Checking."
    assert calls == [("get_weather", json.dumps(arguments, ensure_ascii=False))] * 2


def test_without_a_schema_a_value_that_reads_as_json_is_json():
    unbound = SYNTAXES["qwen3_coder"]
    text = unbound.render([("f", {"n": 2, "s": "two", "b": True})])
    assert unbound.parse(text)[1] == [("f", '{"n": 2, "s": "two", "b": true}')]


def test_an_incomplete_or_broken_call_stays_text():
    assert SYNTAX.parse(CALL[:40]) == (CALL[:40], [])
    broken = CALL.replace("\n3\n", "\nthree\n")  # days is an integer: not JSON
    assert SYNTAX.parse(broken) == (broken, [])
    assert SYNTAX.scan("Hi " + broken)[2] == 3


def test_partial_calls_grow_into_the_final_arguments():
    final = SYNTAX.parse(CALL)[1][0][1]
    seen = []
    for end in range(len(CALL)):
        text = CALL[:end]
        _, calls, broken = SYNTAX.scan(text)
        assert calls == [] and broken == (0 if end >= len("<tool_call>") else None)
        partial = SYNTAX.partial_calls(text, 0) if broken is not None else []
        if partial:
            assert partial[0][0] == "get_weather" and final.startswith(partial[0][1]), (text, partial)
            seen.append(partial[0][1])
    assert seen[0] == "{" and '{"city": "New York' in seen and '{"city": "New York", "days": 3' in seen
    assert all(not s.endswith("\n") and '"New York\\n' not in s for s in seen)  # the end tag is held back


def test_the_chat_template_picks_the_syntax():
    template = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + name + '>\\n' }}"
    assert syntax_for_model("qwen3_moe", template) == "qwen3_coder"
    assert syntax_for_model("qwen3_moe", "{{ '<tool_call>' }}") == "hermes"


def test_a_call_that_is_not_an_object_is_refused_when_written():
    with pytest.raises(ValueError, match="must be a JSON object"):
        SYNTAX.render([("get_weather", [1])])
