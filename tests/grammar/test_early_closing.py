"""Closing a constrained output early: the closing text the grammar needs from any point, and the
runaway guard that spots a loop — on the real tokenizer and grammars, no model."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from grammar_factories import allowed_ids, decode, encode, make_backend, make_constraint
from grammar_fakes import SearchCountingGrammar

from grammar.backend import GrammarError
from grammar.runtime.early_closing import EarlyClosing
from grammar.runtime.runaway import RunawayGuard

COMPANY = {"type": "object", "properties": {"company": {"type": "string"}, "id": {"type": "integer"}},
           "required": ["company", "id"]}
RANGES = {"type": "object", "properties": {"ranges": {"type": "array", "items": {
    "type": "object", "properties": {"max": {"type": "integer"}, "min": {"type": "integer"}},
    "required": ["max", "min"]}}}, "required": ["ranges"]}
NODE = {"$defs": {"node": {"type": "object", "properties": {"data": {"$ref": "#/$defs/node"}}}},
        "$ref": "#/$defs/node"}
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def make_grammar(kind: str = "json_schema", spec: object = "", **options):
    backend = make_backend()
    return backend.make_grammar(backend.compile(make_constraint(kind, spec, whitespace="compact", **options)))


def guard_reason(text: str) -> tuple[str | None, int]:
    """The guard's first reason over `text`'s tokens, fed one at a time, and the tokens it took."""
    guard = RunawayGuard(make_backend().token_bytes)
    for num_tokens, token_id in enumerate(encode(text), 1):
        reason = guard.update([token_id])
        if reason is not None:
            return reason, num_tokens
    return None, len(encode(text))


def close(grammar, max_tokens: int = 256) -> str:
    """Append the grammar's closing and return its text; the grammar must end there."""
    closing = grammar.closing_token_ids(max_tokens)
    assert closing is not None and len(closing) <= max_tokens
    assert grammar.accept_tokens(closing)
    assert grammar.is_terminated()
    stop_ids = set(make_backend().stop_token_ids)
    return decode([t for t in closing if t not in stop_ids])


# ---- the closing ------------------------------------------------------------------------------

CLOSING_CASES = [
    (COMPANY, '{"company":"nordstrom_nordst'),  # inside a string, a required property still to come
    (COMPANY, '{"company":"x","id":1000000'),  # inside an integer
    (COMPANY, '{"company":"x\\u00'),  # inside an escape
    (COMPANY, '{'),
    (RANGES, '{"ranges":[{"max":1,"min":1},{"max":1,'),
    (RANGES, '{"ranges":[{"max":1,"min":1},'),  # an item must follow the comma
    (NODE, '{"data":{"data":{"data":{"data":'),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 5}, "b": {"type": "boolean"},
                                       "c": {"type": "number"}, "d": {"enum": ["north", "south"]},
                                       "e": {"type": "array", "items": {"type": "integer"}, "minItems": 2}},
      "required": ["a", "b", "c", "d", "e"]}, '{"a":"x'),  # every later property is required
    ({"type": "object", "properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"]},
     '{"when":"20'),
    ({"type": "object", "properties": {"score": {"type": "integer", "minimum": 100}}, "required": ["score"]},
     '{"score":'),
]


@pytest.mark.parametrize("schema, prefix", CLOSING_CASES)
def test_the_closing_completes_a_valid_document(schema, prefix):
    grammar = make_grammar(spec=schema)
    assert grammar.accept_tokens(encode(prefix))
    text = prefix + close(grammar)
    jsonschema.validate(json.loads(text), schema)


def test_json_object_closes_every_container():
    grammar = make_grammar("json_object")
    prefix = '{"a":[1,{"b":"c' + '\\"'
    assert grammar.accept_tokens(encode(prefix))
    assert isinstance(json.loads(prefix + close(grammar)), dict)


def test_the_search_leaves_the_matcher_as_it_was():
    grammar = make_grammar(spec=COMPANY)
    assert grammar.accept_tokens(encode('{"company":"acme'))
    before = allowed_ids(grammar)
    assert grammar.closing_token_ids(64) is not None
    assert allowed_ids(grammar) == before
    assert grammar.accept_tokens(encode(' inc","id":7}')) and grammar.is_terminated()


def test_no_closing_within_too_few_tokens():
    grammar = make_grammar(spec=RANGES)
    assert grammar.accept_tokens(encode('{"ranges":[{"max":1,'))
    assert grammar.closing_token_ids(1) is None
    assert grammar.closing_token_ids(64) is not None


@pytest.mark.parametrize("kind, spec, prefix, pattern", [
    ("regex", r"[A-Z]{2}-\d{3}", "Q", r"[A-Z]{2}-\d{3}"),
    ("regex", r"(ab)+c?", "abab", r"(ab)+c?"),  # complete already: only the stop token is needed
    ("grammar", 'root ::= sum\nsum ::= num ("+" num)*\nnum ::= [1-9] [0-9]?', "12+", r"[1-9][0-9]?(\+[1-9][0-9]?)*"),
])
def test_regex_and_grammar_close_where_the_grammar_allows(kind, spec, prefix, pattern):
    grammar = make_grammar(kind, spec)
    assert grammar.accept_tokens(encode(prefix))
    assert re.fullmatch(pattern, prefix + close(grammar, 16))


def test_choice_closes_to_a_choice():
    grammar = make_grammar("choice", choices=["it depends", "no"])
    assert grammar.accept_tokens(encode("it"))
    assert "it" + close(grammar, 16) == "it depends"


def test_a_budget_below_the_shortest_output_is_refused_with_the_minimum():
    schema = {"type": "object", "properties": {"first": {"type": "string"}, "second": {"type": "string"}},
              "required": ["first", "second"]}
    grammar = make_grammar(spec=schema)
    minimum = len(grammar.closing_token_ids(64))
    assert minimum > 3
    with pytest.raises(GrammarError, match=f"max_tokens is 3, .* takes {minimum} tokens: set max_tokens to at "
                                           f"least {minimum}"):
        EarlyClosing(grammar).check_minimum(3)
    EarlyClosing(grammar).check_minimum(minimum)  # exactly enough is fine
    with pytest.raises(GrammarError, match="context are left after the prompt"):
        EarlyClosing(grammar).check_minimum(3, by_context=True)


def test_budget_closing_acts_only_near_the_end():
    grammar = make_grammar(spec=COMPANY)
    closing = EarlyClosing(grammar)
    closing.check_minimum(200)
    assert grammar.accept_tokens(encode('{"company":"acme'))
    assert closing.check([], 150) is None  # far from the end: nothing to do
    found = closing.check([], len(grammar.closing_token_ids(64)) + 2)
    assert found is not None and found[1] == "budget"
    assert grammar.accept_tokens(found[0]) and grammar.is_terminated()


def close_while_writing(schema: dict, script: str, max_tokens: int, recheck: bool):
    """Write `script` a token at a time under a budget of `max_tokens`, checking the closing after
    each: (tokens written when it closed, the closing text, searches made)."""
    grammar = SearchCountingGrammar(make_grammar(spec=schema), recheck)
    closing = EarlyClosing(grammar)
    closing.check_minimum(max_tokens)
    script_ids = encode(script)
    for num_written, token_id in enumerate(script_ids, 1):
        assert grammar.accept_tokens([token_id])
        found = closing.check([token_id], max_tokens - num_written)
        if found is not None:
            assert found[1] == "budget" and num_written + len(found[0]) <= max_tokens
            assert grammar.accept_tokens(found[0]) and grammar.is_terminated()
            stop_ids = set(make_backend().stop_token_ids)
            text = decode(script_ids[:num_written] + [t for t in found[0] if t not in stop_ids])
            jsonschema.validate(json.loads(text), schema)
            return num_written, text, grammar.num_searches
    raise AssertionError("never closed")


COMPANY_NAME = '{"company":"' + " ".join(f"word{i}" for i in range(60))
REPORT = {"type": "object", "properties": {
    "summary": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "score": {"type": "integer"}, "source": {"type": "object", "properties": {"url": {"type": "string"}},
                                             "required": ["url"]}},
    "required": ["summary", "tags", "score", "source"]}
REPORT_SCRIPT = '{"summary":"' + " ".join(f"word{i}" for i in range(80))
RANGE_ITEMS = '{"ranges":[' + ",".join(f'{{"max":{i * 7},"min":{i}}}' for i in range(40))


@pytest.mark.parametrize("schema, script, max_tokens", [(COMPANY, COMPANY_NAME, 90), (REPORT, REPORT_SCRIPT, 120),
                                                        (RANGES, RANGE_ITEMS, 120)])
def test_a_closing_that_still_completes_the_output_saves_the_search(schema, script, max_tokens):
    searched = close_while_writing(schema, script, max_tokens, recheck=False)
    rechecked = close_while_writing(schema, script, max_tokens, recheck=True)
    assert rechecked[:2] == searched[:2]  # closed at the same token, with the same text
    # without the recheck, every step of the last stretch searches; with it, only the steps where
    # the output left the last closing behind (here a new item of the array), and the last one
    assert rechecked[2] <= searched[2]
    if schema is not RANGES:  # inside one string the first closing holds to the end
        assert searched[2] > 10 and rechecked[2] <= 3


def test_an_earlier_closing_is_checked_from_where_the_matcher_stands():
    grammar = make_grammar(spec=COMPANY)
    assert grammar.accept_tokens(encode('{"company":"acme'))
    closing = grammar.closing_token_ids(64)
    before = allowed_ids(grammar)
    assert grammar.accept_tokens(encode(" widgets inc"))
    assert grammar.completes(closing) and grammar.completes(closing, strict=True)
    grammar.rollback(len(encode(" widgets inc")))
    assert allowed_ids(grammar) == before  # nothing changed
    assert grammar.accept_tokens(encode('","id":'))
    assert not grammar.completes(closing) and not grammar.completes(closing, strict=True)
    assert grammar.accept_tokens(encode("42}")) and grammar.is_terminated()
    assert not grammar.completes(closing)  # nothing can follow a finished output


def test_the_end_of_an_earlier_closing_serves_once_the_output_went_its_way():
    grammar = SearchCountingGrammar(make_grammar(spec=COMPANY))
    closing = EarlyClosing(grammar)
    closing.check_minimum(22)  # the closing from the start: '{"company":"","id":0}'
    assert grammar.num_searches == 1
    script_ids = encode('{"company":"acme inc","id":')
    for num_written, token_id in enumerate(script_ids, 1):  # within twice the closing: checked every step
        assert grammar.accept_tokens([token_id])
        assert closing.check([token_id], 22 - num_written) is None
    # the key, the string, the next key: each time an end of that first closing still completed it
    assert grammar.num_searches == 1
    found = closing.check([], 11)
    assert found is not None and decode(found[0]).startswith("0}")


# ---- the runaway guard --------------------------------------------------------------------------

LOOPS = [
    (COMPANY, '{"company":"' + "nordstrom_" * 40, "repetition"),
    (COMPANY, '{"company":"' + "Vacuum " * 40, "repetition"),
    (COMPANY, '{"company":"x","id":' + "31415926535897932384626433832795", "digits"),
    (COMPANY, '{"company":"x","id":1' + "0" * 60, "digits"),
    (NODE, '{"data":' * 40, "repetition"),
    ("json_object", "".join(f'{{"k{i}":' for i in range(20)), "depth"),
    (RANGES, '{"ranges":[' + '{"max":1,"min":1},' * 20, "repetition"),
    (NAME, '{"name":"' + "\\u00f8" * 40, "repetition"),
]


@pytest.mark.parametrize("spec, loop, reason", LOOPS)
def test_each_loop_is_caught_and_closed(spec, loop, reason):
    found, num_tokens = guard_reason(loop)
    assert found == reason
    assert num_tokens < len(encode(loop))  # caught before the loop's end
    kind = "json_object" if spec == "json_object" else "json_schema"
    grammar = make_grammar(kind, "" if kind == "json_object" else spec)
    prefix_ids = encode(loop)[:num_tokens]
    assert grammar.accept_tokens(prefix_ids)
    document = json.loads(decode(prefix_ids) + close(grammar))
    if kind == "json_schema":
        jsonschema.validate(document, spec)


def test_distinct_items_and_long_prose_are_not_loops():
    assert guard_reason("[" + ",".join(str(i) for i in range(200)) + "]")[0] is None
    items = "[" + ",".join(f'"user{i}@example.com"' for i in range(200)) + "]"
    assert guard_reason(items)[0] is None
    words = ("river stone quiet morning lantern copper harbor violet meadow thunder paper orbit garden "
             "silver candle forest window marble ribbon echo").split()
    rng = random.Random(0)
    story = '{"story":"' + " ".join(rng.choice(words) for _ in range(400)) + '"}'
    assert guard_reason(story)[0] is None
    assert guard_reason('{"id":123456789012345678}')[0] is None  # 18 digits: still an int64
    assert guard_reason('{"digits":"' + "31415926535897932384626433832795" + '"}')[0] is None  # in a string
