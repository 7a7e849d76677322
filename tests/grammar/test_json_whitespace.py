"""JSON whitespace modes: what each lets through, that the default bounds every gap, and that the
docs name the default the engine uses."""
from __future__ import annotations

from pathlib import Path

import pytest

from grammar.constraint import BOUNDED_JSON_WHITESPACE, DEFAULT_JSON_WHITESPACE, JSON_WHITESPACE_MODES, Constraint
from grammar_factories import accepts, make_backend, make_constraint

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "integer"}}},
          "required": ["name", "tags"], "additionalProperties": False}
COMPACT = '{"name":"Ada","tags":[1,2]}'
SPACED = '{"name": "Ada", "tags": [1, 2]}'
PRETTY = '{\n "name": "Ada",\n "tags": [1, 2]\n}'
WIDE = '{\n    "name": "Ada",\n    "tags": [1, 2]\n}'  # four-space indents: three and more characters per gap
RUNAWAY = '{"name": "Ada"' + "\n" * 40 + ', "tags": []}'


def compiled(whitespace: str, kind: str = "json_schema"):
    spec = SCHEMA if kind == "json_schema" else ""
    return make_backend().compile(make_constraint(kind, spec, whitespace=whitespace))


@pytest.mark.parametrize("whitespace, texts", [
    ("compact", {COMPACT: True, SPACED: False, PRETTY: False, WIDE: False, RUNAWAY: False}),
    ("spaced", {COMPACT: False, SPACED: True, PRETTY: False, WIDE: False, RUNAWAY: False}),
    ("bounded", {COMPACT: True, SPACED: True, PRETTY: True, WIDE: False, RUNAWAY: False}),
    ("any", {COMPACT: True, SPACED: True, PRETTY: True, WIDE: True, RUNAWAY: True}),
])
def test_each_mode_lets_through_what_it_says(whitespace, texts):
    grammar = compiled(whitespace)
    for text, expected in texts.items():
        assert accepts(grammar, text) is expected, (whitespace, text)


def test_json_object_follows_the_mode_too():
    assert accepts(compiled("bounded", "json_object"), PRETTY)
    assert not accepts(compiled("bounded", "json_object"), RUNAWAY)
    assert not accepts(compiled("compact", "json_object"), SPACED)


def test_the_default_bounds_every_gap():
    assert DEFAULT_JSON_WHITESPACE in JSON_WHITESPACE_MODES and DEFAULT_JSON_WHITESPACE != "any"
    grammar = make_backend().compile(make_constraint("json_schema", SCHEMA))
    assert not accepts(grammar, RUNAWAY)
    gap = " " * (BOUNDED_JSON_WHITESPACE + 1)
    assert not accepts(grammar, '{"name":' + gap + '"Ada","tags":[]}')


def test_any_whitespace_is_the_any_mode_and_wins():
    assert Constraint("json_object", any_whitespace=True, whitespace="compact").json_whitespace == "any"
    assert Constraint("json_object").json_whitespace == DEFAULT_JSON_WHITESPACE
    keys = {Constraint("json_object", whitespace=w).cache_key for w in JSON_WHITESPACE_MODES}
    assert len(keys) == len(JSON_WHITESPACE_MODES)  # each mode is its own grammar in the cache
    assert Constraint("json_object").cache_key == Constraint("json_object", whitespace=DEFAULT_JSON_WHITESPACE).cache_key
    assert Constraint("regex", "a+", whitespace="any").cache_key == Constraint("regex", "a+").cache_key


def test_an_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown whitespace mode 'loose'; expected one of compact, spaced"):
        Constraint("json_object", whitespace="loose").validate()


def test_the_docs_name_the_default():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "constraints.md").read_text(encoding="utf-8")
    assert f"default `{DEFAULT_JSON_WHITESPACE}`" in docs
