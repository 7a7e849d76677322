"""A think section with its own constraint, compiled by both backends on the SmolLM2 tokenizer: the
text between the markers must match it, then the end marker, then the answer's constraint."""
from __future__ import annotations

import pytest
from grammar_factories import accepted_by, make_backend, make_constraint, make_llguidance_backend

from grammar.constraint import ANY_TEXT, Constraint, after_thinking

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
STEPS = Constraint("regex", r"(\d\. [a-z ]{1,30}\n){1,3}")
BACKENDS = {"xgrammar": make_backend, "llguidance": make_llguidance_backend}


def answer_after(think: Constraint, answer=None) -> Constraint:
    answer = answer if answer is not None else make_constraint("json_schema", PERSON)
    composed = after_thinking(answer, "</think>", 0, think, "<think>")
    assert composed is not None
    composed.validate()
    return composed


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]()


def accepts(backend, constraint: Constraint, text: str) -> bool:
    return accepted_by(backend, backend.compile(constraint), text)


def test_think_text_matching_its_regex_then_the_marker_then_a_valid_answer(backend):
    constraint = answer_after(STEPS)
    steps = "1. find the name\n2. write it\n"
    assert accepts(backend, constraint, f"<think>\n{steps}</think>\n\n" + '{"name": "Bo"}')
    assert accepts(backend, constraint, f"{steps}</think>" + '{"name": "Bo"}')  # the prompt opened it
    assert accepts(backend, constraint, f"<think>{steps}</think>\n" + '{"name": "Bo"}')


def test_think_text_that_does_not_match_is_refused(backend):
    constraint = answer_after(STEPS)
    assert not accepts(backend, constraint, "<think>\nI should find the name.\n</think>\n" + '{"name": "Bo"}')
    assert not accepts(backend, constraint, "<think>\n1. a\n2. b\n3. c\n4. d\n</think>" + '{"name": "Bo"}')
    assert not accepts(backend, constraint, "<think>\n1. a\n</think>\nBo")  # the answer keeps its schema
    assert not accepts(backend, constraint, '{"name": "Bo"}')  # the think section is not optional


def test_a_json_think_section_and_a_choice_answer(backend):
    think = make_constraint("json_schema", {"type": "object", "properties": {"plan": {"type": "string"}},
                                            "required": ["plan"]})
    constraint = answer_after(think, Constraint("choice", choices=["yes", "no"]))
    assert accepts(backend, constraint, '<think>{"plan": "check"}</think>\n\nyes')
    assert not accepts(backend, constraint, "<think>check</think>\n\nyes")
    assert not accepts(backend, constraint, '<think>{"plan": "check"}</think>\n\nmaybe')


def test_a_think_constraint_alone_leaves_the_answer_free(backend):
    constraint = after_thinking(None, "</think>", 0, STEPS, "<think>")
    assert constraint is not None and constraint.spec == ANY_TEXT
    assert accepts(backend, constraint, "<think>\n1. look\n</think>\n\nAnything at all.")
    assert not accepts(backend, constraint, "<think>\nlook\n</think>\n\nAnything at all.")


def test_a_lark_think_grammar(backend):
    think = Constraint("grammar", 'start: "Step: " WORD "\\n"\nWORD: /[a-z]+/\n', grammar_syntax="lark")
    constraint = answer_after(think, Constraint("regex", "[0-9]+"))
    assert accepts(backend, constraint, "<think>\nStep: add\n</think>\n42")
    assert not accepts(backend, constraint, "<think>\nadd\n</think>\n42")


def test_the_think_constraint_is_part_of_the_cache_key():
    keys = {answer_after(STEPS).cache_key, answer_after(Constraint("regex", "[a-z]+")).cache_key,
            after_thinking(make_constraint("json_schema", PERSON), "</think>", 0).cache_key}
    assert len(keys) == 3


@pytest.mark.parametrize(("options", "message"), [
    ({"think": STEPS}, "needs think_end"),
    ({"think": STEPS, "think_end": "</think>", "think_budget": 8}, "cannot be combined with a think budget"),
    ({"think": Constraint("tool_calls", "{}"), "think_end": "</think>"}, "kind must be one of"),
    ({"think": Constraint("regex", ""), "think_end": "</think>"}, "think constraint: a regex constraint needs"),
    ({"think": Constraint("regex", "a", think_end="</x>"), "think_end": "</think>"}, "think section of its own"),
])
def test_bad_think_constraints_are_refused_naming_the_problem(options, message):
    with pytest.raises(ValueError, match=message):
        Constraint("regex", "a", **options).validate()


def test_the_closing_search_is_given_the_think_constraints_words():
    from grammar.runtime.closing_hints import closing_hints

    composed = answer_after(Constraint("regex", r"\w+ done\."), Constraint("json_object"))
    hints = closing_hints(composed)
    assert "</think>" in hints and " done." in hints
    assert " done." not in closing_hints(after_thinking(Constraint("json_object"), "</think>", 0))
