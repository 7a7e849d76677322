"""uniqueItems over arrays of free strings: the path tree that says which arrays of the output
must hold distinct strings, the tracker that follows the output, and the matcher on both
backends that masks a token closing a repeated element (jsonschema the reference)."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from grammar_factories import encode, make_backend, make_constraint, make_llguidance_backend

from grammar.config import GrammarConfig
from grammar.json_schema.unique_strings import runtime_unique_strings
from grammar.runtime.unique_strings import UniqueStringsTracker
from grammar.selection import SelectingBackend
from grammar.unique_strings_grammar import UniqueStringsCompiled

TAGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["tags"],
          "properties": {"tags": TAGS, "free": {"type": "array", "items": {"type": "string"}},
                         "groups": {"type": "object", "additionalProperties": TAGS}}}


def tracker_for(schema):
    return UniqueStringsTracker(runtime_unique_strings(schema)[1])


# -- the tracker ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, fine", [
    ('{"tags":["a","b"]}', True),
    ('{"tags":["a","a"]}', False),
    ('{"tags":["a","\\u0061"]}', False),  # one value, two spellings
    ('{"tags":["a\\"","a"]}', True),
    ('{"tags": [ "x" , "y" , "x" ]}', False),
    ('{"free":["a","a"],"tags":["a"]}', True),  # only the array that says so
    ('{"groups":{"g":["a","b"],"h":["a","a"]}}', False),  # through additionalProperties
    ('{"groups":{"g":["a"],"h":["a"]}}', True),  # each array its own
    ('{"tags":["[a]","{\\"b\\":1}","[a]"]}', False),  # brackets inside strings are text
])
def test_the_tracker_stops_at_the_repeated_element(text, fine):
    assert tracker_for(SCHEMA).feed(text.encode()) is fine


def test_a_clone_goes_its_own_way():
    tracker = tracker_for(SCHEMA)
    assert tracker.feed(b'{"tags":["a",')
    assert tracker.in_unique_array
    assert not tracker.clone().feed(b'"a"')
    assert tracker.clone().feed(b'"b"') and tracker.feed(b'"c"]')
    assert not tracker.in_unique_array


# -- which arrays ---------------------------------------------------------------------------------

def test_the_schema_loses_only_the_unique_items_it_hands_over():
    schema, tree = runtime_unique_strings(SCHEMA)
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert "uniqueItems" not in json.dumps(schema)
    assert tree["properties"]["tags"]["unique"] and tree["properties"]["free"] is None


@pytest.mark.parametrize("schema", [
    # branches that mark the same arrays (the node's own properties in each), or only scalars
    {"type": "object", "properties": {"t": TAGS}, "anyOf": [{"required": ["t"]}, {"required": ["u"]}]},
    {"type": "object", "properties": {"t": {"oneOf": [{"type": "string"}, TAGS]}}},
    {"allOf": [{"$ref": "#/$defs/a"}, {"properties": {"t": TAGS}}], "$defs": {"a": {"properties": {"x": {}}}}},
    # a recursive definition: a cyclic tree
    {"$defs": {"n": {"type": "object", "properties": {"t": TAGS, "kids": {"type": "array",
                                                                          "items": {"$ref": "#/$defs/n"}}}}},
     "$ref": "#/$defs/n"},
    # a pattern every non-empty name matches, where no other name may be
    {"type": "object", "patternProperties": {".": TAGS}, "additionalProperties": False},
])
def test_taken_where_the_path_tells(schema):
    assert runtime_unique_strings(schema) is not None


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "string", "maxLength": 1}, "uniqueItems": True},  # could run out
    {"type": "array", "items": {"type": "string", "pattern": "^a+$"}, "uniqueItems": True},
    {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True},
    {"type": "object", "anyOf": [{"properties": {"t": TAGS}}, {"properties": {"t": {"type": "array"}}}]},
    {"type": "object", "properties": {"t": TAGS}, "not": {"properties": {"t": TAGS}}},
    {"type": "object", "patternProperties": {"^x": TAGS}},
    {"type": "object", "patternProperties": {".": TAGS}},  # the name "" would get additionalProperties
    {"$defs": {"d": TAGS}, "type": "object", "properties": {"t": {"$ref": "#d"}}},
])
def test_left_in_the_schema_otherwise(schema):
    assert runtime_unique_strings(schema) is None


# -- the matcher, on both backends -----------------------------------------------------------------

def make_selecting() -> SelectingBackend:
    return SelectingBackend({"xgrammar": make_backend(), "llguidance": make_llguidance_backend()},
                            GrammarConfig())


BACKENDS = ["xgrammar", "llguidance"]
INSTANCES = [{"tags": t} for t in ([], ["a"], ["a", "b"], ["a", "a"], ["a", "b", "a"], ["", ""], ["ab", "a"],
                                   ["a", "a "])] + [{"tags": ["x"], "groups": {"g": ["p", "q"], "h": ["p", "p"]}},
                                                    {"tags": ["x"], "free": ["z", "z"]}]


@pytest.mark.parametrize("name", BACKENDS)
def test_both_backends_take_exactly_the_distinct_arrays_strict(name):
    backend = make_selecting()
    compiled = backend.compile(make_constraint(spec=SCHEMA, grammar_backend=name, whitespace="compact"))
    assert isinstance(compiled, UniqueStringsCompiled) and compiled.backend_name == name
    validator = jsonschema.Draft202012Validator(SCHEMA)
    verdicts = set()
    for instance in INSTANCES:
        ordered = {k: instance[k] for k in SCHEMA["properties"] if k in instance}
        grammar = backend.make_grammar(compiled)
        text = json.dumps(ordered, separators=(",", ":"))
        taken = grammar.accept_tokens(encode(text)) and (grammar.is_terminated() or grammar.accept_tokens([2]))
        verdicts.add(validator.is_valid(ordered))
        assert taken == validator.is_valid(ordered), text
    assert verdicts == {True, False}


def allowed(backend, grammar) -> set[bytes]:
    bitmask = backend.allocate_bitmask(1)
    grammar.fill_bitmask(bitmask, 0)
    words = bitmask.numpy().view(np.uint32)[0]
    return {backend.token_bytes[i] for i in range(len(backend.token_bytes)) if words[i >> 5] >> (i & 31) & 1}


@pytest.mark.parametrize("name", BACKENDS)
def test_the_mask_leaves_out_only_the_closings_of_a_repeat(name):
    backend = make_selecting()
    grammar = backend.make_grammar(backend.compile(make_constraint(spec=SCHEMA, grammar_backend=name)))
    assert grammar.accept_tokens(encode('{"tags":["ab","a'))
    before = allowed(backend, grammar)
    assert {b'"', b'",', b'"]'} <= before  # "a" is new
    assert grammar.accept_tokens(encode('",')) and grammar.accept_tokens(encode('"a'))
    now = allowed(backend, grammar)
    assert not {b'"', b'",', b'"]'} & now  # "a" again: no closing quote
    assert b'b' in now  # but "ab" is closed only later, and "a..." goes on
    assert not grammar.accept_tokens(encode('"]}'))  # all or nothing
    assert grammar.accept_tokens(encode('c"]}'))


@pytest.mark.parametrize("name", BACKENDS)
def test_rollback_forgets_the_elements_it_takes_back(name):
    backend = make_selecting()
    grammar = backend.make_grammar(backend.compile(make_constraint(spec=SCHEMA, grammar_backend=name)))
    assert grammar.accept_tokens(encode('{"tags":['))
    element = encode('"a",')
    assert grammar.accept_tokens(element)
    assert not grammar.accept_tokens(encode('"a"'))
    grammar.rollback(len(element))
    assert grammar.accept_tokens(encode('"b",')) and grammar.accept_tokens(encode('"a"]}'))


@pytest.mark.parametrize("name", BACKENDS)
def test_a_closing_that_would_repeat_an_element_is_not_offered(name):
    backend = make_selecting()
    grammar = backend.make_grammar(backend.compile(make_constraint(spec=SCHEMA, grammar_backend=name)))
    assert grammar.accept_tokens(encode('{"tags":["",'))
    grammar.accept_tokens(encode('"'))
    closing = grammar.closing_token_ids(32)
    # the shortest closing ends the open string at once: "" again, so it is refused
    assert closing is None or json.loads(
        '{"tags":["","' + b"".join(backend.token_bytes[t] for t in closing if t != 2).decode())["tags"][1] != ""


def test_a_cycle_of_references_is_followed_whole():
    # b reaches the array only through a, which the search is inside of when it meets b first
    schema = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}, "t": TAGS}},
                        "b": {"type": "object", "anyOf": [{"properties": {"a": {"$ref": "#/$defs/a"}}},
                                                          {"properties": {"a": {"type": "string"}}}]}},
              "$ref": "#/$defs/a"}
    assert runtime_unique_strings(schema) is None  # b's branches mark different arrays
    tuple_items = {"type": "array", "items": [TAGS]}
    assert runtime_unique_strings(tuple_items) is None


@pytest.mark.parametrize("name", BACKENDS)
def test_random_walks_never_stick_and_end_valid(name):
    """Tokens drawn at random among the allowed ones, biased to quotes (repeats are what the
    mask is for): a mask is never empty, and every output that ends is valid."""
    import random

    schema = {"type": "object", "additionalProperties": False, "required": ["tags"],
              "properties": {"tags": {"type": "array", "items": {"type": "string", "minLength": 0},
                                      "minItems": 3, "maxItems": 5, "uniqueItems": True}}}
    backend = make_selecting()
    compiled = backend.compile(make_constraint(spec=schema, grammar_backend=name, whitespace="compact"))
    validator = jsonschema.Draft202012Validator(schema)
    # short tokens (so that "", "a", "b"... repeat often) and the stop token
    short = [i for i, data in enumerate(backend.token_bytes) if 0 < len(data) <= 2] + [2]
    rng = random.Random(7)
    num_ended = 0
    for _ in range(12):
        grammar = backend.make_grammar(compiled)
        text = b'{"tags":['
        assert grammar.accept_tokens(encode(text.decode()))
        for _ in range(120):
            bitmask = backend.allocate_bitmask(1)
            grammar.fill_bitmask(bitmask, 0)
            words = bitmask.numpy().view(np.uint32)[0]
            assert words.any(), text  # never stuck
            ids = [i for i in short if words[i >> 5] >> (i & 31) & 1]
            if not ids:
                break
            closers = [i for i in ids if i == 2 or set(backend.token_bytes[i]) & set(b'"]}')]
            token_id = rng.choice(closers if closers and rng.random() < 0.6 else ids)
            assert grammar.accept_tokens([token_id])
            if token_id == 2 or grammar.is_terminated():
                num_ended += 1
                assert validator.is_valid(json.loads(text + (backend.token_bytes[token_id] if token_id != 2 else b""))), text
                break
            text += backend.token_bytes[token_id]
    assert num_ended >= 6
