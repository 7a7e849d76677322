"""What the llguidance backend does beyond the shared contract (tests/test_grammar_backend_contract.py):
the same closed objects and whitespace as xgrammar, its own refusals, and hostile constraints."""
from __future__ import annotations

import json
import time

import pytest
from fuzz_requests import BOMBS, LLGUIDANCE_TAKES
from grammar_factories import make_constraint, make_llguidance_backend

from grammar.backend import GrammarError, UnsupportedError
from grammar.chat.tool_calls import Tool, ToolCalls
from grammar.compiler import GrammarCompiler
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def accepts(constraint: Constraint, text: str) -> bool:
    backend = make_llguidance_backend()
    grammar = backend.make_grammar(backend.compile(constraint))
    return grammar.accept_tokens(backend.forced_text.encode(text)) and (
        grammar.is_terminated() or grammar.accept_tokens(backend.stop_token_ids))


def test_a_format_llguidance_does_not_check_is_an_annotation_one_it_checks_is_enforced():
    reference = make_llguidance_backend().compile(make_constraint(spec={"type": "string", "format": "uri-reference"}))
    assert reference.not_enforced == ["format 'uri-reference' at / (the root) is an annotation, not checked"]
    date = make_constraint(spec={"type": "string", "format": "date"}, whitespace="compact")
    assert accepts(date, '"2024-01-31"')
    assert not accepts(date, '"yesterday"')


def test_undeclared_properties_are_refused_as_on_xgrammar():
    assert accepts(make_constraint(spec=PERSON, whitespace="compact"), '{"name":"a"}')
    assert not accepts(make_constraint(spec=PERSON, whitespace="compact"), '{"name":"a","x":1}')


@pytest.mark.parametrize("whitespace, good, bad", [
    ("compact", '{"name":"a"}', '{"name": "a"}'),
    ("spaced", '{"name": "a"}', '{"name":"a"}'),
    ("bounded", '{ "name" :  "a"}', '{"name":   "a"}'),
    ("any", '{\n\n\n   "name":"a"}', '{"name":"a",}'),
])
def test_each_whitespace_mode(whitespace, good, bad):
    constraint = make_constraint(spec=PERSON, whitespace=whitespace)
    assert accepts(constraint, good)
    assert not accepts(constraint, bad)


def test_ebnf_is_translated_and_lark_read_as_it_is():
    assert accepts(make_constraint("grammar", 'root ::= "a" [0-9]+'), "a42")
    assert accepts(make_constraint("grammar", 'start: "a" /[0-9]+/', grammar_syntax="lark"), "a42")


def test_best_effort_lists_each_keyword_llguidance_drops_with_its_place():
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}},
              "propertyNames": {"minLength": 1}}
    # strict: llguidance reports the first keyword it meets
    with pytest.raises(UnsupportedError, match=r'unsupported keyword "propertyNames" at / \(the root\)'):
        make_llguidance_backend().compile(make_constraint(spec=schema))
    compiled = make_llguidance_backend().compile(make_constraint(spec=schema, strict=False))
    assert sorted(compiled.not_enforced) == ["propertyNames at / (the root)", "uniqueItems at /properties/tags"]


def test_auto_tool_calls_are_free_text_until_the_trigger():
    tool = Tool("f", parameters={"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    constraint = make_constraint("tool_calls", ToolCalls((tool,), "auto").to_spec())
    assert accepts(constraint, "No call needed.")
    assert accepts(constraint, "Let me call it. " + call + " Done.")
    assert not accepts(constraint, "Let me call it. " + call.replace("1", '"one"'))
    mistral = make_constraint("tool_calls", ToolCalls((tool,), "auto", syntax="mistral").to_spec())
    assert accepts(mistral, 'Sure. [TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "f", "arguments": '
                            '{"x": 2}}]')
    assert not accepts(mistral, 'Sure. [TOOL_CALLS][{"name": "g", "arguments": {"x": 1}}]')


def test_what_only_xgrammar_does_is_refused_naming_it():
    backend = make_llguidance_backend()
    with pytest.raises(UnsupportedError, match="think_budget"):
        backend.compile(make_constraint("regex", "a", think_end="</think>", think_budget=4))


def test_tool_calls_with_an_answer_take_either():
    spec = ToolCalls((Tool("f", parameters={"type": "object", "properties": {"x": {"type": "integer"}}}),), "auto",
                     answer={"kind": "choice", "choices": ["done"]}).to_spec()
    constraint = make_constraint("tool_calls", spec)
    assert accepts(constraint, "done")
    assert accepts(constraint, '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert not accepts(constraint, "other")


REFUSED = ["regex-huge-count", "regex-wrapping-count", "regex-nested-counts", "regex-wide-count", "regex-deep-parens",
           "regex-unbalanced", "schema-pattern-nested-counts", "schema-pattern-huge-count", "schema-min-length",
           "schema-min-items", "schema-max-length-negative", "schema-pattern-not-string", "schema-type-nonsense",
           "schema-enum-not-list", "schema-text-deep-1000", "schema-text-deep-brackets", "ebnf-undefined",
           "schema-recursive-required"]


def _constraint(bomb: dict) -> Constraint:
    (field, value), = bomb.items()
    kind = {"json_schema_text": "json_schema"}.get(field, field)
    return Constraint(kind, value if isinstance(value, str) else json.dumps(value))


@pytest.mark.parametrize("name", REFUSED)
def test_compile_bombs_are_refused_with_a_message(name):
    compiler = GrammarCompiler(make_llguidance_backend(), GrammarConfig())
    with pytest.raises(GrammarError) as error:
        compiler.compile_sync(_constraint(BOMBS[name]))
    assert len(str(error.value)) > 20 and "internal error" not in str(error.value)


def test_every_bomb_is_refused_or_taken():
    assert not set(REFUSED) & LLGUIDANCE_TAKES
    assert set(BOMBS) - set(REFUSED) - LLGUIDANCE_TAKES == {"schema-struct-deep-40", "schema-text-not-json",
                                                           "choice-empty-string", "regex-empty"}  # refused before


@pytest.mark.parametrize("name", sorted(LLGUIDANCE_TAKES))
def test_the_bombs_llguidance_takes_cost_it_little(name):
    """Ambiguous repeats fill fast on llguidance; a grammar that never ends is not refused
    (docs/constraints.md) but each fill stays cheap, so the request runs to its max_tokens (or,
    past one of llguidance's parser limits, ends with its reason)."""
    backend = make_llguidance_backend()
    grammar = backend.make_grammar(backend.compile(_constraint(BOMBS[name])))
    bitmask = backend.allocate_bitmask(1)
    start = time.thread_time()
    for _ in range(16):
        try:
            grammar.fill_bitmask(bitmask, 0)
            forced = grammar.jump_forward_token_ids()
            allowed = (bitmask[0] != 0).nonzero()
            if not forced and len(allowed):
                word = int(allowed[0][0])
                token_id = next(32 * word + b for b in range(32) if int(bitmask[0, word]) >> b & 1)
                if token_id in backend.stop_token_ids or not grammar.accept_tokens([token_id]):
                    break
        except GrammarError:  # past one of its parser limits: the request ends with llguidance's reason
            break
    assert time.thread_time() - start < 1.0


def test_choices_are_taken_literally_and_a_think_section_comes_before_any_kind():
    choice = make_constraint("choice", "", choices=['it depends (see "notes")', "a\\b", "é\n"])
    assert accepts(choice, 'it depends (see "notes")') and accepts(choice, "a\\b") and accepts(choice, "é\n")
    assert not accepts(choice, "a")
    lark = make_constraint("grammar", 'start: "yes" | "no"', grammar_syntax="lark", think_end="</think>")
    assert accepts(lark, "hmm</think>\nno") and not accepts(lark, "hmm</think>maybe")
    assert accepts(make_constraint("json_object", "", think_end="</think>"), 'x</think>{"a":1}')


def test_a_matcher_its_parser_limits_break_raises_with_llguidance_s_reason():
    # every "a" token leaves llguidance forcing an endless run of "a"s: past its item limit, the
    # matcher is broken for good, and each later call says so instead of allowing nothing
    backend = make_llguidance_backend()
    grammar = backend.make_grammar(backend.compile(make_constraint("grammar", 'root ::= "a" root')))
    bitmask = backend.allocate_bitmask(1)
    grammar.fill_bitmask(bitmask, 0)
    (token_id,) = [32 * w + b for w in (bitmask[0] != 0).nonzero().flatten().tolist() for b in range(32)
                   if int(bitmask[0, w]) >> b & 1]
    with pytest.raises(GrammarError, match="llguidance could not go on after 0 tokens: .*[Tt]oo many items"):
        grammar.accept_tokens([token_id])
    with pytest.raises(GrammarError, match="llguidance could not go on"):
        grammar.fill_bitmask(bitmask, 0)


def test_loading_the_backend_leaves_torch_compile_unloaded():
    """llguidance.torch compiles a function when imported (torch._dynamo: seconds of every start);
    the backend writes masks through its own two helpers instead."""
    import subprocess
    import sys
    code = ("import sys, grammar.llguidance.backend, grammar.llguidance.matcher; "
            "print('torch._dynamo' in sys.modules, 'llguidance.torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_mask_is_refused_unless_it_is_the_memory_llguidance_writes():
    import torch

    from grammar.llguidance.token_bitmask import allocate_token_bitmask, fill_next_token_bitmask
    backend = make_llguidance_backend()
    matcher = backend.compile(make_constraint(spec=PERSON)).template.deep_copy()
    mask = allocate_token_bitmask(2, backend.vocab_size)
    fill_next_token_bitmask(matcher, mask, 1)
    assert (mask[0] == -1).all() and 0 < int((mask[1] != 0).sum()) < mask.shape[1]  # row 1 only: '{' or space
    for bad in (mask.to(torch.int64), mask.t(), mask[0]):
        with pytest.raises(ValueError, match="token bitmask"):
            fill_next_token_bitmask(matcher, bad, 0)
