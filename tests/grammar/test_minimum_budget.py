"""A max_tokens below the shortest output a constraint accepts is refused before the first token,
for every kind: tool calls, think sections, regexes (a word at the end too), grammars, choices —
on the real tokenizer and both backends, no model."""
from __future__ import annotations

import json

import msgspec
import pytest
from conftest import make_request
from grammar_factories import make_backend, make_llguidance_backend
from test_tool_call_grammar import WEATHER, tools_constraint

from engine.structured_output.manager import StructuredOutputManager
from grammar.backend import GrammarError
from grammar.config import GrammarConfig
from grammar.constraint import Constraint
from grammar.runtime.early_closing import EarlyClosing

PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]})
CONSTRAINTS = {
    "tool call, required": tools_constraint(),
    "tool call, named": tools_constraint("named", WEATHER.name),
    "json after thinking": Constraint("json_schema", PERSON, think_end="</think>"),
    "tool call after thinking": tools_constraint(think_end="</think>"),
    "regex": Constraint("regex", r"[A-Z]{12}-[0-9]{6}"),
    "regex ending in a word": Constraint("regex", r"\w+[\\](\w+\.)*\w+\.dll"),
    "grammar": Constraint("grammar", 'root ::= "The answer, after some thought, is: " [0-9]+ "."'),
    "choice": Constraint("choice", choices=["a rather long first choice", "another long choice here"]),
}


BACKENDS = {"xgrammar": make_backend, "llguidance": make_llguidance_backend}


@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
@pytest.mark.parametrize("constraint", CONSTRAINTS.values(), ids=list(CONSTRAINTS))
def test_below_the_shortest_output_is_refused_with_the_minimum(constraint, backend_name):
    backend = BACKENDS[backend_name]()
    compiled = backend.compile(constraint)
    minimum = compiled.min_output_tokens
    assert minimum is not None and minimum > 3
    grammar = backend.make_grammar(compiled)
    with pytest.raises(GrammarError, match=f"max_tokens is 3, .* takes {minimum} tokens"):
        EarlyClosing(grammar).check_minimum(3, min_output_tokens=minimum)
    EarlyClosing(grammar).check_minimum(minimum, min_output_tokens=minimum)  # exactly enough is fine
    # the minimum is a real output: its tokens take the grammar to its end
    closing = grammar.closing_token_ids(minimum)
    assert closing is not None and len(closing) == minimum
    assert grammar.accept_tokens(closing) and grammar.is_terminated()


def test_free_text_needs_no_minimum():
    minimum = make_backend().compile(tools_constraint("auto")).min_output_tokens
    assert minimum == 1  # a stop token: no call is needed


@pytest.mark.parametrize("name", ["tool call, required", "json after thinking", "regex ending in a word"])
def test_the_engine_refuses_it_before_the_first_token(name):
    manager = StructuredOutputManager(make_backend(), GrammarConfig())
    request = make_request(num_tokens=5, max_tokens=3, constraint=CONSTRAINTS[name])
    manager.grammar_init(request.request_id, request.structured_output)
    manager._futures[request.request_id].result(timeout=60)
    with pytest.raises(GrammarError, match="max_tokens is 3, but the shortest output"):
        manager.try_activate(request.request_id, request.structured_output, max_tokens=3, context_left=1000)
    off = make_request(num_tokens=5, max_tokens=3,
                       constraint=msgspec.structs.replace(CONSTRAINTS[name], close_early=False))
    manager.grammar_init(off.request_id, off.structured_output)
    manager._futures[off.request_id].result(timeout=60)
    # closing off: nothing is checked, the output may be cut
    assert manager.try_activate(off.request_id, off.structured_output, max_tokens=3, context_left=1000)



def test_both_backends_know_a_long_shortest_output_when_compiling():
    # a real schema's shape (JSONSchemaBench's Github_ultra): hundreds of required parts, a
    # shortest output of hundreds of tokens that a step's 20 ms search cannot find
    many = json.dumps({"type": "object", "properties": {f"field_{n:03d}": {"type": "integer"} for n in range(150)},
                       "required": [f"field_{n:03d}" for n in range(150)]})
    minimums = {name: factory().compile(Constraint("json_schema", many)).min_output_tokens
                for name, factory in BACKENDS.items()}
    assert minimums["xgrammar"] is not None and minimums["xgrammar"] > 300
    assert minimums["llguidance"] == minimums["xgrammar"]
