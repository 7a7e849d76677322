"""What every GrammarBackend / Grammar pair must do, seen only through the ABCs of grammar/backend.py.

Each backend joins by adding a factory to BACKENDS: the backend on the real SmolLM2 tokenizer, how
to encode text with that tokenizer, and a stop token id. Everything below runs against each.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
from grammar_factories import VOCAB_PADDING, make_backend, make_constraint, make_llguidance_backend

from grammar.backend import CompiledGrammar, Grammar, GrammarBackend, GrammarError
from grammar.chat.tool_calls import Tool, ToolCalls

TOKENIZER_VOCAB = 49152
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
WEATHER = Tool(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                           "required": ["city"]})


@dataclass(frozen=True)
class BackendUnderTest:
    backend: GrammarBackend
    stop_token_id: int

    def encode(self, text: str) -> list[int]:
        encoder = self.backend.text_encoder()
        assert encoder is not None, "the contract tests need the tokenizer's plain encoding"
        return encoder(text)

    def grammar(self, kind: str = "json_schema", spec: object = PERSON, **options) -> Grammar:
        return self.backend.make_grammar(self.backend.compile(make_constraint(kind, spec, **options)))

    def accepts(self, compiled: CompiledGrammar, text: str) -> bool:
        """A fresh matcher takes `text` and then ends: it terminated, or it takes a stop token."""
        grammar = self.backend.make_grammar(compiled)
        if not grammar.accept_tokens(self.encode(text)):
            return False
        return grammar.is_terminated() or grammar.accept_tokens([self.stop_token_id])

    def allowed(self, grammar: Grammar) -> np.ndarray:
        bitmask = self.backend.allocate_bitmask(1)
        grammar.fill_bitmask(bitmask, 0)
        return np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")


def _xgrammar() -> BackendUnderTest:
    backend = make_backend()
    return BackendUnderTest(backend, backend.stop_token_ids[0])


def _llguidance() -> BackendUnderTest:
    backend = make_llguidance_backend()
    return BackendUnderTest(backend, backend.stop_token_ids[0])


# name -> factory
BACKENDS = {"xgrammar": _xgrammar, "llguidance": _llguidance}


@pytest.fixture(params=sorted(BACKENDS), scope="module")
def under_test(request) -> BackendUnderTest:
    return BACKENDS[request.param]()


KINDS = [
    ("json_schema", PERSON, {}, '{"name":"Bo","age":7}', '{"name":"Bo"}'),
    ("json_object", "", {}, '{"x":[1,{"y":null}]}', "[1]"),
    ("regex", r"[a-z]+@[a-z]+\.com", {}, "bob@example.com", "bob@example"),
    ("grammar", 'root ::= "yes" | "no"', {}, "no", "maybe"),
    ("grammar", 'start: "yes" | "no"', {"grammar_syntax": "lark"}, "yes", "maybe"),
    ("choice", "", {"choices": ["red", "green"]}, "green", "blue"),
    ("tool_calls", ToolCalls((WEATHER,), "required").to_spec(), {},
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', "Oslo"),
    ("regex", "(yes|no)", {"think_end": "</think>"}, "let me see</think>yes", "yes"),
]


@pytest.mark.parametrize("kind, spec, options, good, bad", KINDS,
                         ids=[f"{k[0]}-{i}" for i, k in enumerate(KINDS)])
def test_each_constraint_kind_compiles_to_a_grammar_that_enforces_it(under_test, kind, spec, options, good, bad):
    compiled = under_test.backend.compile(make_constraint(kind, spec, **options))
    assert isinstance(compiled, CompiledGrammar) and compiled.num_bytes > 0
    assert compiled.not_enforced == []
    assert under_test.accepts(compiled, good)
    assert not under_test.accepts(compiled, bad)


@pytest.mark.parametrize("string", [{"type": "string"}, {"type": "string", "maxLength": 8},
                                    {"type": "string", "minLength": 1, "maxLength": 2000},
                                    {"type": ["string", "null"], "maxLength": 8}, {"type": "string", "pattern": "^a.b$"}])
def test_a_json_string_holds_no_raw_control_character(under_test, string):
    # JSON forbids them raw (a strict parser refuses "a<TAB>b"); xgrammar's own form of a
    # length-bounded string let them through
    compiled = under_test.backend.compile(make_constraint(spec={"type": "object", "properties": {"s": string},
                                                                "required": ["s"]}))
    assert under_test.accepts(compiled, '{"s":"a-b"}')
    for raw in ("\t", "\x01", "\x1f"):
        assert not under_test.accepts(compiled, '{"s":"a' + raw + 'b"}'), repr(raw)


def test_the_bitmask_has_one_bit_per_id_and_starts_all_allowed(under_test):
    bitmask = under_test.backend.allocate_bitmask(3)
    assert str(bitmask.dtype) == "torch.int32" and bitmask.device.type == "cpu"
    vocab_size = TOKENIZER_VOCAB + VOCAB_PADDING
    assert bitmask.shape == (3, (vocab_size + 31) // 32)
    assert (bitmask == -1).all()


def test_a_fill_allows_exactly_the_next_tokens_and_changes_nothing(under_test):
    grammar = under_test.grammar()
    ids = under_test.encode('{"name":"Al","age":12}')
    first = under_test.allowed(grammar)
    assert first[ids[0]] and not first[under_test.encode("[")[0]]
    assert (under_test.allowed(grammar) == first).all()  # filling twice: the same row
    assert grammar.accept_tokens(ids)  # the fills left the matcher at the start


def test_a_fill_writes_only_its_own_row(under_test):
    grammar = under_test.grammar("regex", "[0-9]+")
    bitmask = under_test.backend.allocate_bitmask(2)
    grammar.fill_bitmask(bitmask, 1)
    assert (bitmask[0] == -1).all()
    assert not (bitmask[1] == -1).all()


def test_padding_ids_and_spare_bits_are_never_allowed(under_test):
    grammar = under_test.grammar()
    assert grammar.accept_tokens(under_test.encode('{"name":"'))
    bits = under_test.allowed(grammar)  # inside a string: nearly everything is allowed
    assert bits[:TOKENIZER_VOCAB].sum() > 40000
    assert not bits[TOKENIZER_VOCAB:].any()
    assert not grammar.accept_tokens([TOKENIZER_VOCAB + 3])


def test_stop_tokens_are_allowed_exactly_where_the_output_may_end(under_test):
    grammar = under_test.grammar("regex", "a+")
    assert not under_test.allowed(grammar)[under_test.stop_token_id]
    assert grammar.accept_tokens(under_test.encode("a"))
    assert under_test.allowed(grammar)[under_test.stop_token_id]


def test_accept_tokens_is_all_or_nothing(under_test):
    grammar = under_test.grammar()
    good = under_test.encode('{"name":')
    assert not grammar.accept_tokens(good + under_test.encode("}"))
    assert grammar.accept_tokens(good)  # nothing of the rejected call was kept
    assert not grammar.accept_tokens([-1])


def test_rollback_undoes_accepted_tokens_and_refuses_more_than_were_accepted(under_test):
    grammar = under_test.grammar()
    ids = under_test.encode('{"name":"Al","age":12}')
    assert grammar.accept_tokens(ids)
    assert grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    grammar.rollback(0)
    assert grammar.accept_tokens(ids[-1:]) and grammar.is_terminated()
    grammar.rollback(len(ids))
    assert grammar.accept_tokens(ids)  # back at the start
    with pytest.raises(ValueError):
        grammar.rollback(len(ids) + 1)


def test_is_terminated_after_a_stop_token_or_once_nothing_may_follow(under_test):
    regex = under_test.grammar("regex", "a+")
    assert regex.accept_tokens(under_test.encode("aa"))
    assert not regex.is_terminated()  # more "a"s may follow
    assert regex.accept_tokens([under_test.stop_token_id])
    assert regex.is_terminated()
    closed = under_test.grammar("json_object", "")
    assert closed.accept_tokens(under_test.encode('{"a":1}'))
    assert closed.is_terminated()  # a closed object: no stop token needed


def test_jump_forward_tokens_are_forced_text_and_already_accepted(under_test):
    grammar = under_test.grammar(spec={**PERSON, "required": ["name", "age"]}, whitespace="compact")
    forced = grammar.jump_forward_token_ids()
    assert forced, "an object whose first key is fixed forces its start"
    assert under_test.backend.text_encoder()('{"name":"')[:len(forced)] == forced
    assert not grammar.accept_tokens(forced)  # already accepted: "{" cannot come again
    grammar.rollback(len(forced))
    assert grammar.accept_tokens(under_test.encode('{"name":"Al","age":1}'))


def test_nothing_is_forced_where_the_model_has_a_choice(under_test):
    grammar = under_test.grammar("regex", "[a-z]+")
    assert grammar.jump_forward_token_ids() == []
    assert grammar.accept_tokens(under_test.encode("ab"))  # nothing was accepted by the call


def test_a_closing_completes_the_output_and_leaves_the_matcher_as_it_was(under_test):
    grammar = under_test.grammar()
    start = under_test.encode('{"name":"Al')
    assert grammar.accept_tokens(start)
    closing = grammar.closing_token_ids(64)
    assert closing is not None and 1 < len(closing) <= 64
    assert grammar.closing_token_ids(1) is None  # `","age":0}` takes more than one token
    assert grammar.completes(closing, strict=True)
    assert grammar.accept_tokens(closing) and grammar.is_terminated()
    grammar.rollback(len(closing))
    assert grammar.accept_tokens(under_test.encode('","age":3}'))  # the searches changed nothing


def test_completes_says_whether_tokens_still_complete_the_output(under_test):
    grammar = under_test.grammar("regex", "(abc|abd)")
    assert grammar.accept_tokens(under_test.encode("a"))
    assert grammar.completes(under_test.encode("bc"))
    assert not grammar.completes(under_test.encode("b"))
    assert not grammar.completes(under_test.encode("bx"))
    assert grammar.accept_tokens(under_test.encode("bd"))  # completes changed nothing


@pytest.mark.parametrize("kind, spec", [
    ("regex", "a(b"),
    ("grammar", "root ::= undefined_rule"),
    ("grammar", "start: missing_rule"),
    ("json_schema", "{not json"),
    ("json_schema", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    ("json_schema", {"type": "string", "minLength": -1}),
    ("tool_calls", '{"tools": 3}'),
])
def test_bad_specs_raise_a_grammar_error(under_test, kind, spec):
    with pytest.raises(GrammarError):
        under_test.backend.compile(make_constraint(kind, spec))


def test_strict_refuses_what_it_cannot_enforce_and_best_effort_lists_it(under_test):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(GrammarError, match="uniqueItems"):
        under_test.backend.compile(make_constraint(spec=schema))
    compiled = under_test.backend.compile(make_constraint(spec=schema, strict=False))
    assert compiled.not_enforced == ["uniqueItems at / (the root)"]
    assert under_test.backend.make_grammar(compiled).not_enforced == compiled.not_enforced


def test_a_grammar_compiled_elsewhere_is_refused(under_test):
    class Foreign(CompiledGrammar):
        num_bytes = 1

    with pytest.raises(TypeError):
        under_test.backend.make_grammar(Foreign())


def test_compiles_run_concurrently(under_test):
    specs = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
             for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        compiled = list(pool.map(lambda s: under_test.backend.compile(make_constraint(spec=s)), specs))
    for i, one in enumerate(compiled):
        assert under_test.accepts(one, json.dumps({f"k{i}": i}, separators=(",", ":")))
        assert not under_test.accepts(one, json.dumps({f"k{(i + 1) % 4}": i}, separators=(",", ":")))
