"""tool_calls constraints and think sections, compiled by the real backend on the SmolLM2 tokenizer:
what they accept, the masks before and after a trigger / end marker, and the errors of a bad tool."""
from __future__ import annotations

import json

import numpy as np
import pytest
from grammar_factories import accepts, allowed_ids, encode, make_backend, make_llguidance_backend

from grammar.backend import GrammarError
from grammar.chat.structural_tag import StructuralTagError
from grammar.chat.tool_calls import Tool, ToolCalls
from grammar.constraint import Constraint

WEATHER = Tool("get_weather", "The weather in a city",
               {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "unit": {"enum": ["c", "f"]}}, "required": ["city"]})
TIME = Tool("get_time", "", {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]})
TOKENIZER_VOCAB = 49152
CALL_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


def tools_constraint(choice="required", name="", parallel=True, syntax="hermes", tools=(WEATHER, TIME), **options):
    return Constraint("tool_calls", ToolCalls(tuple(tools), choice, name, parallel, syntax).to_spec(), **options)


def compiled(constraint):
    return make_backend().compile(constraint)


def test_required_allows_only_calls_of_the_tools_with_valid_arguments():
    grammar = compiled(tools_constraint())
    assert accepts(grammar, CALL_WEATHER)
    assert accepts(grammar, CALL_TIME)
    assert accepts(grammar, CALL_WEATHER + "\n" + CALL_TIME)  # parallel calls
    assert not accepts(grammar, "Let me check the weather.")
    assert not accepts(grammar, "")  # at least one call
    assert not accepts(grammar, CALL_WEATHER.replace("get_weather", "get_wether"))
    assert not accepts(grammar, CALL_WEATHER.replace('"city"', '"town"'))  # not in the schema
    assert not accepts(grammar, CALL_WEATHER.replace('"Paris"', '"' + "x" * 21 + '"'))  # maxLength


def test_named_allows_only_that_tool_and_one_call_without_parallel():
    grammar = compiled(tools_constraint("named", "get_time", parallel=False))
    assert accepts(grammar, CALL_TIME)
    assert not accepts(grammar, CALL_WEATHER)
    assert not accepts(grammar, CALL_TIME + "\n" + CALL_TIME)


def test_a_single_call_ends_the_output():
    backend = make_backend()
    grammar = backend.make_grammar(compiled(tools_constraint(parallel=False)))
    assert grammar.accept_tokens(encode(CALL_WEATHER))
    assert grammar.is_terminated()


def test_auto_is_free_until_the_trigger_then_constrained():
    backend = make_backend()
    constraint = tools_constraint("auto")
    assert accepts(compiled(constraint), "It is sunny today.")
    assert accepts(compiled(constraint), "Let me look. " + CALL_WEATHER)
    assert not accepts(compiled(constraint), "Let me look. " + CALL_WEATHER.replace("get_weather", "search"))
    grammar = backend.make_grammar(compiled(constraint))
    assert grammar.accept_tokens(encode("Let me look."))
    free = allowed_ids(grammar)
    assert len(free) >= TOKENIZER_VOCAB - 64  # all-ones, but for a few special ids
    assert grammar.accept_tokens(encode(" <tool_call>"))
    inside = allowed_ids(grammar)
    assert 0 < len(inside) < 50  # the call's text, nothing else
    assert not grammar.accept_tokens(encode("hello"))


def test_auto_with_an_answer_constraint_is_that_answer_or_calls():
    person = {"kind": "json_schema", "spec": '{"type": "object", "properties": {"name": {"type": "string"}}, '
                                             '"required": ["name"]}'}
    constraint = Constraint("tool_calls", ToolCalls((WEATHER, TIME), "auto", answer=person).to_spec())
    grammar = compiled(constraint)
    assert accepts(grammar, '{"name": "Bo"}')
    assert accepts(grammar, CALL_WEATHER)
    assert accepts(grammar, CALL_WEATHER + "\n" + CALL_TIME)
    assert not accepts(grammar, "It is sunny today.")  # free text no longer
    assert not accepts(grammar, '{"nom": "Bo"}')
    assert not accepts(grammar, CALL_WEATHER.replace('"city"', '"town"'))
    choice = Constraint("tool_calls", ToolCalls((WEATHER,), "auto", answer={"kind": "choice",
                                                                          "choices": ["yes", "no"]}).to_spec())
    assert accepts(compiled(choice), "no") and not accepts(compiled(choice), "maybe")
    with pytest.raises(GrammarError, match="the answer's regex"):
        compiled(Constraint("tool_calls", ToolCalls((WEATHER,), "auto", answer={"kind": "regex"}).to_spec()))


NOTE_TAG = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<note"], "tags": [
    {"type": "tag", "begin": "<note>", "content": {"type": "regex", "pattern": "[a-z ]{1,20}"}, "end": "</note>"}]}}
NOTE = "<note>check the sky</note>"
TAG_TEXTS = ["It is sunny.", "Sure. " + NOTE, "Sure. " + CALL_WEATHER, NOTE + " then " + CALL_WEATHER + " done",
             CALL_WEATHER + "\n" + CALL_TIME + " " + NOTE, "<note>Loud!</note>",
             CALL_WEATHER.replace('"city"', '"town"'), "<note>a</note> " + CALL_WEATHER.replace("get_weather", "x")]


def tag_beside_tools(parallel=True):
    answer = {"kind": "structural_tag", "spec": json.dumps(NOTE_TAG)}
    return Constraint("tool_calls", ToolCalls((WEATHER, TIME), "auto", parallel=parallel, answer=answer).to_spec())


def test_a_structural_tag_beside_tools_joins_its_tags_to_the_calls_on_both_backends():
    """Free text may hold the tag's tags and the calls alike, each in its own shape."""
    expected = [True, True, True, True, True, False, False, False]
    assert [accepts(compiled(tag_beside_tools()), text) for text in TAG_TEXTS] == expected
    backend = make_llguidance_backend()
    on_llguidance = backend.compile(tag_beside_tools())

    def llguidance_accepts(text: str) -> bool:
        grammar = backend.make_grammar(on_llguidance)
        return grammar.accept_tokens(encode(text)) and (grammar.is_terminated()
                                                        or grammar.accept_tokens(backend.stop_token_ids))
    assert [llguidance_accepts(text) for text in TAG_TEXTS] == expected
    one = compiled(tag_beside_tools(parallel=False))  # stops after the first tag of either kind
    assert accepts(one, "Sure. " + CALL_WEATHER) and accepts(one, NOTE)
    assert not accepts(one, NOTE + " " + CALL_WEATHER)


def test_a_structural_tag_of_another_shape_beside_tools_is_that_answer_or_calls():
    fixed = {"type": "structural_tag", "format": {"type": "tag", "begin": "Answer: ", "content": {
        "type": "regex", "pattern": "[0-9]{1,3}"}, "end": "."}}
    answer = {"kind": "structural_tag", "spec": json.dumps(fixed)}
    grammar = compiled(Constraint("tool_calls", ToolCalls((WEATHER,), "auto", answer=answer).to_spec()))
    assert accepts(grammar, "Answer: 42.") and accepts(grammar, CALL_WEATHER)
    assert not accepts(grammar, "Answer: 42. " + CALL_WEATHER) and not accepts(grammar, "Answer: x.")


def test_a_structural_tag_trigger_that_clashes_with_the_calls_is_named():
    clash = json.loads(json.dumps(NOTE_TAG))
    clash["format"]["triggers"] = ["<tool"]
    clash["format"]["tags"][0]["begin"] = "<tool>"
    answer = {"kind": "structural_tag", "spec": json.dumps(clash)}
    with pytest.raises(StructuralTagError, match=r"format.triggers\[0\]: '<tool' clashes with the tool calls' "
                                                 r"trigger '<tool_call>' \(hermes syntax\)"):
        ToolCalls((WEATHER,), "auto", answer=answer).validate()


@pytest.mark.parametrize("syntax, text", [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
                '{"name": "get_time", "arguments": {"zone": "UTC"}}]'),
])
def test_other_families_call_syntax(syntax, text):
    grammar = compiled(tools_constraint(syntax=syntax))
    assert accepts(grammar, text)
    assert not accepts(grammar, CALL_WEATHER)
    assert ToolCalls.from_spec(tools_constraint(syntax=syntax).spec).call_syntax.parse(text)[1][0][0] == "get_weather"


def test_a_bad_tool_schema_names_the_tool_and_the_pointer():
    bad = Tool("tag_items", "", {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}})
    with pytest.raises(GrammarError, match=r'tools\[1\] "tag_items" parameters: unsupported keyword "uniqueItems" '
                                           r"at /properties/tags"):
        compiled(tools_constraint(tools=(WEATHER, bad)))
    best_effort = compiled(tools_constraint(tools=(WEATHER, bad), strict=False))
    assert best_effort.not_enforced == ['tool "tag_items": uniqueItems at /properties/tags']


def test_tool_specs_are_checked():
    with pytest.raises(ValueError, match="not one of the tools"):
        tools_constraint("named", "nope").validate()
    with pytest.raises(ValueError, match="used by two tools"):
        tools_constraint(tools=(WEATHER, WEATHER)).validate()
    with pytest.raises(ValueError, match="must be 1-64 letters"):
        tools_constraint(tools=(Tool("no spaces"),)).validate()


# ---- think sections -------------------------------------------------------------------------------

PERSON = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


def num_allowed(grammar) -> int:
    return len(allowed_ids(grammar))


def test_think_mask_is_all_ones_before_the_end_marker_and_the_grammar_after():
    backend = make_backend()
    constraint = Constraint("json_schema", PERSON, think_end="</think>")
    grammar = backend.make_grammar(compiled(constraint))
    plain = backend.make_grammar(compiled(Constraint("json_schema", PERSON)))
    vocab = TOKENIZER_VOCAB
    assert num_allowed(grammar) >= vocab - 64
    assert grammar.accept_tokens(encode("<think>\nThe user wants a person. Maybe Bo"))
    assert num_allowed(grammar) >= vocab - 64
    assert grammar.accept_tokens(encode(".\n</think>\n\n"))
    assert allowed_ids(grammar) == allowed_ids(plain)  # exactly the schema's first tokens
    assert grammar.accept_tokens(encode('{"name": "Bo"}'))
    assert grammar.is_terminated()
    assert accepts(compiled(constraint), '<think>ok</think>{"name": "Bo"}')
    assert not accepts(compiled(constraint), '{"name": "Bo"}')  # the answer comes after thinking


def test_think_budget_forces_the_end_marker():
    backend = make_backend()
    grammar = backend.make_grammar(compiled(Constraint("json_schema", PERSON, think_end="</think>", think_budget=4)))
    thought = encode(" one two three four")
    assert len(thought) == 4
    assert grammar.accept_tokens(thought)
    forced = allowed_ids(grammar)
    assert 0 < len(forced) < 10
    texts = [backend.tokenizer.decode([t]) for t in forced]
    assert all("</think>".startswith(t) or t.startswith("</think>") for t in texts), texts
    assert not grammar.accept_tokens(encode(" five"))


def test_tool_calls_after_thinking():
    constraint = tools_constraint(think_end="</think>")
    assert accepts(compiled(constraint), "<think>\nweather, so call it\n</think>\n\n" + CALL_WEATHER)
    assert not accepts(compiled(constraint), "<think>x</think>It is sunny.")


def test_think_options_are_part_of_the_cache_key():
    keys = {Constraint("json_schema", PERSON, **o).cache_key
            for o in ({}, {"think_end": "</think>"}, {"think_end": "</think>", "think_budget": 8})}
    assert len(keys) == 3
    with pytest.raises(ValueError, match="think_budget needs think_end"):
        Constraint("json_schema", PERSON, think_budget=3).validate()


def test_bitmask_rows_never_allow_padding_inside_a_think_section():
    backend = make_backend()
    grammar = backend.make_grammar(compiled(Constraint("json_schema", PERSON, think_end="</think>")))
    bitmask = backend.allocate_bitmask(1)
    grammar.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    assert not bits[TOKENIZER_VOCAB:].any()
