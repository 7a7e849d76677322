"""The static check behind bounded jump-forward: shortest outputs, dead rules, required bytes."""
from __future__ import annotations

import json

import pytest
from grammar_factories import encode, make_constraint

from grammar.backend import GrammarError
from grammar.config import GrammarConfig
from grammar.regex.repeat_counts import find_large_repeat
from grammar.xgrammar.output_bounds import INFINITE, OutputBounds, analyze

RECURSIVE = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}}, "required": ["child"]}


@pytest.fixture(scope="module")
def xgr():
    import xgrammar
    return xgrammar


def bounds_of(xgr, kind: str, spec) -> OutputBounds:
    from grammar_factories import make_backend
    if kind == "regex":
        grammar = xgr.Grammar.from_regex(spec)
    elif kind == "grammar":
        grammar = xgr.Grammar.from_ebnf(spec)
    else:
        grammar = xgr.Grammar.from_json_schema(json.dumps(spec), any_whitespace=False, separators=(",", ":"),
                                               strict_mode=True)
    return make_backend().output_bounds(grammar)


@pytest.mark.parametrize("kind, spec, min_bytes, required", [
    ("regex", "abc|de", 2, 3),
    ("regex", "[a-z]{3,5}x*", 3, 3),
    ("regex", "(a{1000}){1000}", 1_000_000, 1_000_000),
    ("regex", "a|b{0,9}c{40}", 1, 40),  # the second branch needs 40 once it is taken
    ("grammar", 'root ::= "(" root ")" | "x"', 1, 3),
    ("json_schema", {"type": "object", "properties": {"a": {"const": "hello"}}, "required": ["a"]}, 13, 13),
    ("json_schema", {"type": "string", "pattern": "z{50}"}, 52, 52),  # the pattern's regex is analysed too
])
def test_shortest_and_required_bytes(xgr, kind, spec, min_bytes, required):
    bounds = bounds_of(xgr, kind, spec)
    assert bounds.exact and bounds.dead_rule is None
    assert bounds.min_bytes == min_bytes
    assert bounds.max_required_bytes == required


def test_a_required_self_reference_has_no_finite_output(xgr):
    bounds = bounds_of(xgr, "json_schema", RECURSIVE)
    assert bounds.min_bytes == INFINITE and bounds.dead_rule is not None


def test_an_optional_self_reference_is_fine(xgr):
    optional = {**RECURSIVE, "required": []}
    bounds = bounds_of(xgr, "json_schema", optional)
    assert bounds.min_bytes == 2 and bounds.dead_rule is None  # "{}"


def test_a_dead_branch_is_found(xgr):
    bounds = bounds_of(xgr, "grammar", 'root ::= "x" | "a" r\nr ::= "b" r')
    assert bounds.min_bytes == 1 and bounds.dead_rule == "r"


def test_an_unknown_serialization_refuses_nothing():
    bounds = analyze({"__VERSION__": "v999", "rules": []}, lambda p: OutputBounds(0, 0, None, False))
    assert not bounds.exact and bounds.min_bytes == 0 and bounds.max_required_bytes == 0


@pytest.mark.parametrize("pattern, found", [
    ("a{3}", None),
    ("a{2,100000}", None),
    ("a{100001}", ("100001", 1)),
    ("x(a{2,999999999})", ("999999999", 3)),
    ("b{00000000000000000007}", None),  # leading zeros are not a large count
    ("[{999999999}]", None),  # inside a class a brace is literal
    ("[]{999999999}]", None),
    (r"\{999999999}", None),  # escaped
    ("a{" + "9" * 5000 + "}", ("9" * 24 + "...", 1)),  # no int() of 5000 digits
])
def test_find_large_repeat(pattern, found):
    assert find_large_repeat(pattern, 100_000) == found


def compile_with(spec, kind="regex", **config):
    from grammar.xgrammar.backend import XGrammarBackend
    from grammar_factories import make_backend
    base = make_backend()
    backend = XGrammarBackend.__new__(XGrammarBackend)  # the shared tokenizer state, other limits
    backend.__dict__.update(base.__dict__)
    backend.config = GrammarConfig(**config)
    return backend.compile(make_constraint(kind, spec))


@pytest.mark.parametrize("kind, spec, words", [
    ("regex", "a{99999999999}", "max_repeat_count limit of 100000"),
    ("regex", "(a{1000}){1000}", "max_forced_bytes limit of 65536"),
    ("json_schema", RECURSIVE, "accepts no output of finite length"),
    ("json_schema", {"type": "string", "pattern": "(a{1000}){1000}"}, "max_forced_bytes"),
    ("json_schema", {"type": "string", "pattern": "a{4294967297}"}, '"pattern" at / (the root) has the repetition'),
    ("grammar", 'root ::= "a" root', "accepts no output of finite length"),
])
def test_bombs_are_refused_at_compile_time(kind, spec, words):
    with pytest.raises(GrammarError) as info:
        compile_with(spec, kind)
    assert words in str(info.value)


def test_limits_follow_the_config():
    assert compile_with("[a-z]{0,200}", max_forced_bytes=100).jump_forward_safe  # a maximum forces nothing
    with pytest.raises(GrammarError, match="max_forced_bytes limit of 100"):
        compile_with("[a-z]{200}", max_forced_bytes=100)
    with pytest.raises(GrammarError, match="max_repeat_count limit of 10"):
        compile_with("a{0,11}", max_repeat_count=10)
    with pytest.raises(GrammarError, match="max_fill_ms"):
        compile_with("[a-z]+", max_fill_ms=1e-9)


def test_jump_forward_takes_at_most_max_forced_bytes_per_step():
    from grammar.xgrammar.matcher import XGrammarGrammar
    from grammar_factories import make_backend
    backend = make_backend()
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    compiled = backend.compile(make_constraint("regex", text + "[!?]"))
    grammar = XGrammarGrammar(compiled, backend.forced_text, backend.stop_token_ids, backend.vocab_size,
                              max_forced_bytes=10)
    forced = grammar.jump_forward_token_ids()
    assert forced and len(backend.tokenizer.decode(forced)) <= 10
    assert text.startswith(backend.tokenizer.decode(forced))
    # the rest is still forced, and comes in the following calls
    while True:
        more = grammar.jump_forward_token_ids()
        if not more:
            break
        forced += more
    assert backend.tokenizer.decode(forced) == text[:len(backend.tokenizer.decode(forced))]
    assert len(backend.tokenizer.decode(forced)) > 10
    assert encode(text)  # the tokenizer is the real one


@pytest.mark.parametrize("config, words", [
    ({"max_forced_bytes": 0}, "max_forced_bytes must be >= 1"),
    ({"max_repeat_count": 1 << 31}, "must be below 2"),
    ({"max_fill_ms": 0}, "max_fill_ms must be > 0"),
])
def test_grammar_config_refuses_bad_limits(config, words):
    with pytest.raises(ValueError, match=words):
        GrammarConfig(**config)
