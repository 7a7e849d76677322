"""XGrammarBackend / XGrammarGrammar on the real SmolLM2 tokenizer."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from grammar_factories import VOCAB_PADDING, accepts, allowed_ids, encode, make_backend, make_constraint

from grammar.backend import GrammarError
from grammar.xgrammar.json_grammar import json_grammar

TOKENIZER_VOCAB = 49152
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("kind, spec, options, good, bad", [
    ("json_schema", PERSON, {}, '{"name":"Bo","age":7}', '{"name":"Bo"}'),
    ("json_object", "", {}, '{"x":[1,{"y":null}]}', "[1]"),
    ("regex", r"[a-z]+@[a-z]+\.com", {}, "bob@example.com", "bob@example"),
    ("grammar", 'root ::= "yes" | "no"', {}, "no", "maybe"),
    ("choice", "", {"choices": ["red", "green"]}, "green", "blue"),
])
def test_every_kind_compiles_and_constrains(kind, spec, options, good, bad):
    compiled = make_backend().compile(make_constraint(kind, spec, **options))
    assert compiled.num_bytes > 0
    assert accepts(compiled, good)
    assert not accepts(compiled, bad)


def test_compact_json_unless_any_whitespace():
    compact = make_backend().compile(make_constraint(spec=PERSON, whitespace="compact"))
    loose = make_backend().compile(make_constraint(spec=PERSON, any_whitespace=True))
    spaced = '{"name": "Bo", "age": 7}'
    assert not accepts(compact, spaced)
    assert accepts(loose, spaced)
    assert accepts(loose, '{"name":"Bo","age":7}')


def test_undeclared_properties_are_not_allowed_but_free_objects_stay_free():
    backend = make_backend()
    assert not accepts(backend.compile(make_constraint(spec=PERSON)), '{"name":"Bo","age":7,"x":1}')
    # strict mode alone would read this as "no properties"; normalize keeps it free-form
    free = backend.compile(make_constraint(spec={"type": "object", "maxProperties": 2}))
    assert accepts(free, '{"a":1,"b":"x"}')
    assert not accepts(free, '{"a":1,"b":2,"c":3}')


def test_padding_ids_beyond_the_tokenizer_are_always_masked():
    backend = make_backend()
    assert backend.vocab_size == TOKENIZER_VOCAB + VOCAB_PADDING
    bitmask = backend.allocate_bitmask(2)
    assert bitmask.shape == (2, (backend.vocab_size + 31) // 32)
    grammar = backend.make_grammar(backend.compile(make_constraint(spec=PERSON)))
    assert grammar.accept_tokens(encode('{"name":"'))
    grammar.fill_bitmask(bitmask, 1)  # inside a string: nearly everything is allowed
    bits = np.unpackbits(bitmask[1].numpy().view(np.uint8), bitorder="little")
    assert bits[:TOKENIZER_VOCAB].sum() > 40000
    assert not bits[TOKENIZER_VOCAB:].any()  # padding ids and the last word's spare bits
    assert not grammar.accept_tokens([TOKENIZER_VOCAB + 3])
    assert not grammar.accept_tokens([backend.vocab_size + 100])


def test_accept_rollback_and_termination():
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint(spec=PERSON)))
    ids = encode('{"name":"Al","age":12}')
    assert grammar.accept_tokens(ids[:-1])
    assert not grammar.is_terminated()
    assert grammar.accept_tokens(ids[-1:])
    assert grammar.is_terminated()  # the object is closed: nothing may follow, no EOS needed
    grammar.rollback(1)
    assert not grammar.is_terminated()
    assert grammar.accept_tokens(ids[-1:])
    assert grammar.is_terminated()


def test_a_grammar_that_may_continue_terminates_only_on_a_stop_token():
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint("regex", "a+")))
    assert grammar.accept_tokens(encode("a"))
    assert not grammar.is_terminated()
    assert backend.stop_token_ids[0] in allowed_ids(grammar)
    assert grammar.accept_tokens([backend.stop_token_ids[0]])
    assert grammar.is_terminated()


def test_accept_tokens_is_all_or_nothing():
    backend = make_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint(spec=PERSON)))
    good = encode('{"name":')
    assert not grammar.accept_tokens(good + encode("}"))  # a string must follow the colon
    assert grammar.accept_tokens(good)  # the first part was rolled back, so it is accepted again
    with pytest.raises(ValueError, match="cannot roll back"):
        grammar.rollback(len(good) + 1)


@pytest.mark.parametrize("choice", ["a|b", ".*", 'say "hi"', "back\\slash", "line\nbreak", "tab\there",
                                    "(x)[y]{z}+?", "é ünïcödé", "\x01"])
def test_choices_are_taken_literally(choice):
    others = ["plain", "a"]
    compiled = make_backend().compile(make_constraint("choice", choices=[choice, *others]))
    assert accepts(compiled, choice)
    assert accepts(compiled, "a")
    assert not accepts(compiled, choice + "x")
    assert not accepts(compiled, "b" if choice == "a|b" else "ab")


def test_a_choice_that_prefixes_another_still_terminates_properly():
    compiled = make_backend().compile(make_constraint("choice", choices=["no", "none"]))
    assert accepts(compiled, "no") and accepts(compiled, "none") and not accepts(compiled, "non")


@pytest.mark.parametrize("kind, spec, message", [
    ("regex", "(?=a)b", "Lookahead is not supported"),
    ("regex", "a(b", "regex does not compile"),
    ("grammar", "root ::= undefined_rule", "grammar does not compile"),
    ("json_schema", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "json_schema"),
])
def test_bad_specs_raise_a_precise_grammar_error(kind, spec, message):
    with pytest.raises(GrammarError, match=message):
        make_backend().compile(make_constraint(kind, spec))


def test_xgrammar_warnings_are_captured_and_located():
    schema = {"type": "object", "properties": {
        "ok": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}
    with pytest.raises(GrammarError, match='unsupported keyword "oneOf" at /properties/v: branches may overlap'):
        make_backend().compile(make_constraint(spec=schema))
    compiled = make_backend().compile(make_constraint(spec=schema, strict=False))
    assert compiled.not_enforced == ["oneOf at /properties/v"]
    assert make_backend().make_grammar(compiled).not_enforced == ["oneOf at /properties/v"]


@pytest.mark.parametrize("pattern, good, bad", [
    (r"^\w+[\\](\w+\.)*\w+\.dll$", r'"lib\\System.dll"', [r'"lib\System.dll"', r'"lib\bSystem.dll"']),
    (r'^\w+"$', r'"say\""', ['"say""', '"say\\u0022"']),
    (r"^a\x5cb$", r'"a\\b"', [r'"a\b"', r'"a\\\\b"']),
    (r'^["\\]{2}$', r'"\"\\"', [r'"\"a"', r'"aa"', '"""']),
])
def test_a_pattern_naming_a_quote_or_backslash_is_enforced_on_its_json_text(pattern, good, bad):
    # xgrammar matches a pattern against the JSON text: it gets the escaped form (`\\` for a
    # backslash), so the text is JSON and its value matches the pattern
    compiled = make_backend().compile(make_constraint(spec={"type": "string", "pattern": pattern}))
    assert compiled.not_enforced == []
    assert accepts(compiled, good) and re.fullmatch(pattern, json.loads(good))
    assert not any(accepts(compiled, text) for text in bad)


@pytest.mark.parametrize("pattern", [r'^[!-"]+$', r"^a[\\-z]$"])
def test_a_pattern_naming_a_quote_or_backslash_it_cannot_rewrite_is_refused_and_never_lets_out_bad_json(pattern):
    # a range ending in a quote or a backslash is not rewritten; handed over as it is, xgrammar
    # would let a lone backslash through (`"\"`), which no JSON parser reads
    schema = {"type": "string", "pattern": pattern}
    with pytest.raises(GrammarError, match="pattern"):
        make_backend().compile(make_constraint(spec=schema))
    loose = make_backend().compile(make_constraint(spec=schema, strict=False))
    assert loose.not_enforced == ["pattern at / (the root)"]
    assert not accepts(loose, '"\\"') and not accepts(loose, '"ab""')
    assert accepts(loose, '"ab"')


def test_patterns_that_only_contain_a_quote_in_a_wide_class_stay_enforced():
    compiled = make_backend().compile(make_constraint(spec={"type": "string", "pattern": "^[ -~]{2}$"}))
    assert accepts(compiled, '"ab"') and not accepts(compiled, '"abc"')


@pytest.mark.parametrize("text, lazy", [
    ('root ::= Regex("^(\\?:\\\\S+\\\\s+){0,99}\\\\S+$", json_string=true)\n', True),
    ('root ::= Regex("^((\\?:\\\\S+\\\\s+){0,7}\\\\S+){0,1}$", json_string=true)\n', False),
    ('root ::= Regex("^(ab){8,}$", json_string=true)\n', True),
    ('root ::= Regex("^[a-z]{1,255}$", json_string=true)\n', False),  # a class: one state per count is cheap
    ('root ::= ("a" b){0, 99}\nb ::= "b"\n', False),  # xgrammar's own EBNF repetition
    ("".join(f"r{i} ::= \"x\"\n" for i in range(256)), True),
    ("".join(f"r{i} ::= \"x\"\n" for i in range(255)), False),
])
def test_large_grammars_and_regex_terminals_with_large_group_counts_build_masks_lazily(text, lazy):
    from grammar.xgrammar.conversion import builds_masks_lazily

    assert builds_masks_lazily(text) is lazy


def test_a_grammar_of_many_rules_compiles_lazily_and_enforces_the_same_language():
    import random

    from grammar.xgrammar.conversion import LAZY_MIN_RULES

    # declared names beside open additionalProperties: xgrammar writes a rule per node of their trie
    rng = random.Random(0)
    names = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10)) for _ in range(40)]
    schema = {"type": "object", "properties": {name: {"type": "integer"} for name in names},
              "additionalProperties": True}
    backend = make_backend()
    constraint = make_constraint(spec=schema, strict=True)
    grammar, _ = json_grammar(constraint, backend.config.max_repeat_count)
    assert str(grammar).count(" ::= ") >= LAZY_MIN_RULES
    compiled = backend.compile(constraint)
    first, last = names[0], names[-1]
    assert accepts(compiled, f'{{"{first}":1,"other":"x"}}')
    assert accepts(compiled, f'{{"{first[:4]}":"a prefix of a declared name","{first}x":[]}}')
    assert not accepts(compiled, f'{{"{first}":"a declared name with a string"}}')
    assert not accepts(compiled, f'{{"other":"x","{last}":1.5}}')


def test_a_word_count_pattern_compiles_lazily_and_counts_words_exactly():
    from grammar.xgrammar.conversion import builds_masks_lazily

    schema = {"type": "string", "pattern": r"^(?:\S+\s+){0,99}\S+$"}
    backend = make_backend()
    constraint = make_constraint(spec=schema, strict=True)
    assert builds_masks_lazily(str(json_grammar(constraint, backend.config.max_repeat_count)[0]))
    compiled = backend.compile(constraint)
    assert accepts(compiled, json.dumps(" ".join(["word"] * 100)))
    assert not accepts(compiled, json.dumps(" ".join(["word"] * 101)))
    assert not accepts(compiled, json.dumps("two words "))


def test_a_lazily_built_grammar_is_marked_so_for_its_slow_first_fills():
    from grammar.xgrammar.conversion import builds_masks_lazily

    backend = make_backend()
    lazy = make_constraint(spec={"type": "string", "pattern": r"^(?:\S+\s+){0,99}\S+$"}, strict=True)
    assert builds_masks_lazily(str(json_grammar(lazy, backend.config.max_repeat_count)[0]))
    compiled = backend.compile(lazy)
    assert compiled.lazy_masks and backend.make_grammar(compiled).lazy_masks
    eager = backend.compile(make_constraint(spec={"type": "string"}, strict=True))
    assert not eager.lazy_masks and not backend.make_grammar(eager).lazy_masks
    # the masks a request builds are held by the compiled grammar: its size grows (the cache
    # counts it again on each hit)
    compiled_bytes = compiled.num_bytes
    grammar, bitmask = backend.make_grammar(compiled), backend.allocate_bitmask(1)
    for token_id in encode(json.dumps(" ".join(["word"] * 12))):
        grammar.fill_bitmask(bitmask, 0)
        assert grammar.accept_tokens([token_id])
    assert compiled.num_bytes > compiled_bytes
