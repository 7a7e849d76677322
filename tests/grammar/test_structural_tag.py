"""structural_tag constraints: both shapes parsed and checked (each error naming its field), and
compiled by the real xgrammar backend on the SmolLM2 tokenizer: free text until a trigger, then the
tag's content in its schema / regex / grammar up to its end."""
from __future__ import annotations

import json

import pytest
from grammar_factories import accepts, encode, make_backend, make_llguidance_backend

from grammar.backend import GrammarError, UnsupportedError
from grammar.chat.structural_tag import StructuralTagError, iter_contents, parse_structural_tag
from grammar.constraint import Constraint
from grammar.config import GrammarConfig
from grammar.selection import SelectingBackend, preferred_order

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
LEGACY = {"type": "structural_tag", "triggers": ["<function="],
          "structures": [{"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"}]}
CALL = '<function=get_weather>{"city": "Paris"}</function>'


def make_selecting() -> SelectingBackend:
    return SelectingBackend({"xgrammar": make_backend(), "llguidance": make_llguidance_backend()}, GrammarConfig())


def tagged(content, triggers=("<x",), begin="<x>", end="</x>"):
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": list(triggers), "tags": [
        {"type": "tag", "begin": begin, "content": content, "end": end}]}}


def tag_constraint(tag, **options):
    return Constraint("structural_tag", json.dumps(tag), **options)


def error_of(tag) -> str:
    with pytest.raises(StructuralTagError) as caught:
        parse_structural_tag(tag if isinstance(tag, str) else json.dumps(tag))
    return str(caught.value)


def test_the_legacy_shape_is_triggered_tags_over_json_schema_tags():
    format_ = parse_structural_tag(json.dumps(LEGACY))
    assert format_["type"] == "triggered_tags" and format_["triggers"] == ["<function="]
    assert iter_contents(format_) == [("format.tags[0].content", {"type": "json_schema", "json_schema": WEATHER})]
    as_text = dict(LEGACY, structures=[dict(LEGACY["structures"][0], schema=json.dumps(WEATHER))])
    assert parse_structural_tag(json.dumps(as_text)) == format_  # a schema sent as JSON text


@pytest.mark.parametrize(("tag", "message"), [
    ("{", "structural_tag: is not valid JSON"),
    ([], "structural_tag: must be a JSON object"),
    ({"type": "json_schema", "format": {}}, 'type: must be "structural_tag"'),
    ({"type": "structural_tag"}, 'structural_tag: needs "format"'),
    ({"format": {"type": "tag", "begin": "<a>", "end": "</a>"}}, "format.content: is required in a tag format"),
    ({"format": {"type": "tagg"}}, "format.type: unknown format type 'tagg'"),
    ({"format": {"type": "regex", "pattern": "a", "flags": "i"}}, "format.flags: is not a field of this format"),
    ({"format": {"type": "sequence", "elements": []}}, "format.elements: must be a non-empty list"),
    ({"format": {"type": "tag", "begin": 1, "content": {"type": "any_text"}, "end": "</a>"}},
     "format.begin: must be a string"),
    ({"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": []}},
     "format.end: must be a non-empty list of strings"),
    ({"format": {"type": "json_schema", "json_schema": "{}"}}, "format.json_schema: must be a JSON Schema"),
    ({"format": {"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}}, 'format.style: only "json"'),
    ({"format": {"type": "grammar", "grammar": "root ::= \"a\"", "syntax": "gbnf"}}, "format.syntax: must be"),
    ({"format": {"type": "any_text", "max_tokens": -1}}, "format.max_tokens: must be an integer >= 0"),
    (tagged({"type": "any_text"}, triggers=["<y"]), "format.tags[0].begin: '<x>' starts with none of the triggers"),
    (tagged({"type": "any_text"}, triggers=["<x", "<z"]), "format.triggers[1]: '<z' is not the start of any tag"),
    (tagged({"type": "any_text"}, triggers=["<", "<x"]), "format.tags[0].begin: '<x>' starts with more than one"),
    ({"format": {"type": "triggered_tags", "triggers": ["<x"], "tags": [{"type": "any_text"}]}},
     'format.tags[0]: must be a format of type "tag"'),
    (dict(LEGACY, triggers=["<call="]), "structures[0].begin: '<function=get_weather>' starts with none"),
    (dict(LEGACY, triggers=["<function=", "<tool>"]), "triggers[1]: '<tool>' is not the start of any tag"),
    (dict(LEGACY, structures=[{"begin": "<function=a>", "end": "</function>"}]), "structures[0].schema: is required"),
    (dict(LEGACY, structures=[{"begin": "<function=a>", "schema": 3, "end": "</function>"}]),
     "structures[0].schema: must be a JSON Schema"),
    ({"type": "structural_tag", "structures": [], "triggers": ["<a"]}, "structures: must be a non-empty list"),
    ({"type": "structural_tag", "structures": LEGACY["structures"]}, "triggers: must be a non-empty list"),
])
def test_a_malformed_tag_is_an_error_naming_its_field(tag, message):
    assert error_of(tag).startswith(message)


def test_nesting_is_bounded():
    format_: dict = {"type": "any_text"}
    for _ in range(40):
        format_ = {"type": "tag", "begin": "<a>", "content": format_, "end": "</a>"}
    assert "nested more than 32 deep" in error_of({"format": format_})


def test_constraint_validation_names_the_problem():
    with pytest.raises(ValueError, match=r"format\.tags\[0\]\.begin"):
        tag_constraint(tagged({"type": "any_text"}, triggers=["<y"])).validate()
    with pytest.raises(ValueError, match="needs a non-empty spec"):
        Constraint("structural_tag", "").validate()


def test_free_text_until_the_trigger_then_the_schema_up_to_the_end():
    grammar = make_backend().compile(tag_constraint(LEGACY))
    assert accepts(grammar, "No call needed.")
    assert accepts(grammar, "Let me look: " + CALL + " done.")
    assert not accepts(grammar, "Let me look: " + CALL.replace("city", "town"))
    assert not accepts(grammar, "Let me look: " + CALL.replace("Paris", "P" * 13))  # maxLength
    assert not accepts(grammar, "<function=get_time>{}</function>")  # the trigger leads only into its tags


def test_each_content_kind_in_a_fixed_sequence():
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "tag", "begin": "<n>", "content": {"type": "regex", "pattern": "[0-9]{1,3}"}, "end": "</n>"},
        {"type": "tag", "begin": "<g>", "content": {"type": "grammar", "grammar": 'start: "yes" | "no"',
                                                    "syntax": "lark"}, "end": ["</g>", "</G>"]},
        {"type": "or", "elements": [{"type": "json_schema", "json_schema": {"type": "boolean"}},
                                    {"type": "const_string", "value": "none"}]}]}}
    grammar = make_backend().compile(tag_constraint(tag))
    assert accepts(grammar, "Answer: <n>42</n><g>yes</g>true")
    assert accepts(grammar, "Answer: <n>7</n><g>no</G>none")
    assert not accepts(grammar, "Answer: <n>4242</n><g>yes</g>true")
    assert not accepts(grammar, "Answer: <n>42</n><g>maybe</g>true")


def test_tags_with_separator_and_at_least_one():
    tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "separator": ",", "at_least_one": True,
                                                "tags": [{"type": "tag", "begin": "<a>", "end": "</a>",
                                                          "content": {"type": "json_schema",
                                                                      "json_schema": {"type": "integer"}}}]}}
    grammar = make_backend().compile(tag_constraint(tag))
    assert accepts(grammar, "<a>1</a>,<a>2</a>")
    assert not accepts(grammar, "")
    assert not accepts(grammar, "<a>x</a>")


def test_a_content_that_does_not_compile_is_named_by_its_field():
    backend = make_backend()
    with pytest.raises(GrammarError, match=r"^format\.tags\[0\]\.content\.json_schema: json_schema does not "):
        backend.compile(tag_constraint(tagged({"type": "json_schema", "json_schema": {"type": "strin"}})))
    with pytest.raises(GrammarError, match=r"^format\.tags\[0\]\.content\.pattern: regex does not compile"):
        backend.compile(tag_constraint(tagged({"type": "regex", "pattern": "(ab"})))
    # a "format" keyword inside the schema does not make it the newer shape
    bad_legacy = dict(LEGACY, structures=[dict(LEGACY["structures"][0], schema={"type": "strin", "format": "email"})])
    with pytest.raises(GrammarError, match=r"^structures\[0\]\.schema: json_schema does not compile"):
        backend.compile(tag_constraint(bad_legacy))


def test_strictness_applies_to_the_schemas_inside():
    unique = tagged({"type": "json_schema", "json_schema": {"type": "array", "uniqueItems": True}})
    with pytest.raises(UnsupportedError, match=r'content\.json_schema: unsupported keyword "uniqueItems"'):
        make_backend().compile(tag_constraint(unique))
    best_effort = make_backend().compile(tag_constraint(unique, strict=False))
    assert best_effort.not_enforced == ["format.tags[0].content.json_schema: uniqueItems at / (the root)"]


def test_the_rewrite_makes_a_schema_enforceable_inside_a_tag():
    merged = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"properties": {"a": {"maximum": 5}}}]}
    grammar = make_backend().compile(tag_constraint(tagged({"type": "json_schema", "json_schema": merged})))
    assert accepts(grammar, 'x <x>{"a": 3}</x>')
    assert not accepts(grammar, 'x <x>{"a": 9}</x>')


def llguidance_accepts(compiled, text: str) -> bool:
    backend = make_llguidance_backend()
    grammar = backend.make_grammar(compiled)
    return grammar.accept_tokens(encode(text)) and (grammar.is_terminated()
                                                    or grammar.accept_tokens(backend.stop_token_ids))


def _tag(begin, content=None):
    return {"type": "tag", "begin": begin, "content": content or {"type": "regex", "pattern": "[0-9]+"}, "end": "</x>"}


TEXTS = ["", "hi", "hi <x>1</x>", "<x>1</x>", "<x>1</x> bye", "a <x>1</x> b <x>2</x>", "<x>1</x><x>2</x>", "a <x>z</x>",
         "a <y>1</x>", "<x>1</x>,<x>2</x>"]


@pytest.mark.parametrize("format_", [
    {"type": "triggered_tags", "triggers": ["<x"], "tags": [_tag("<x>")]},
    {"type": "triggered_tags", "triggers": ["<x"], "tags": [_tag("<x>")], "stop_after_first": True},
    {"type": "triggered_tags", "triggers": ["<x"], "tags": [_tag("<x>")], "at_least_one": True},
    {"type": "triggered_tags", "triggers": ["<x"], "tags": [_tag("<x>")], "at_least_one": True,
     "stop_after_first": True},
    {"type": "triggered_tags", "triggers": ["<x"], "tags": [_tag("<x>")], "excludes": ["bye"]},
    {"type": "triggered_tags", "triggers": ["<x", "<y"], "tags": [_tag("<x>"), _tag("<y>", {
        "type": "json_schema", "json_schema": {"type": "integer"}})]},
    {"type": "tags_with_separator", "separator": "", "tags": [_tag("<x>")]},
    {"type": "tags_with_separator", "separator": ",", "tags": [_tag("<x>")], "at_least_one": True},
    {"type": "tags_with_separator", "separator": "", "tags": [_tag("<x>")], "stop_after_first": True},
    {"type": "sequence", "elements": [{"type": "or", "elements": [{"type": "const_string", "value": "a "},
                                                                   {"type": "const_string", "value": "hi "}]},
                                      _tag("<x>", {"type": "grammar", "grammar": 'root ::= [0-9] | "z"'})]},
    {"type": "tag", "begin": "<x>", "content": {"type": "any_text"}, "end": ["</x>", "</y>"]},
])
def test_llguidance_accepts_what_xgrammar_does(format_):
    constraint = tag_constraint({"type": "structural_tag", "format": format_})
    on_xgrammar, on_llguidance = make_backend().compile(constraint), make_llguidance_backend().compile(constraint)
    expected = [accepts(on_xgrammar, text) for text in TEXTS]
    assert [llguidance_accepts(on_llguidance, text) for text in TEXTS] == expected
    assert any(expected)


def test_llguidance_refuses_free_text_it_cannot_end_and_auto_takes_xgrammar():
    sequence = {"type": "sequence", "elements": [{"type": "any_text"}, {"type": "const_string", "value": "END"}]}
    with pytest.raises(UnsupportedError, match=r"^structural_tag format\.elements\[0\]: any_text is only"):
        make_llguidance_backend().compile(tag_constraint({"format": sequence}))
    budget = {"type": "tag", "begin": "<a>", "content": {"type": "any_text", "max_tokens": 4}, "end": "</a>"}
    with pytest.raises(UnsupportedError, match=r"format\.content: any_text's max_tokens"):
        make_llguidance_backend().compile(tag_constraint({"format": budget}))
    # long enough that auto tries llguidance first (grammar/selection.py)
    long_end = dict(sequence, elements=[{"type": "any_text"}, {"type": "const_string", "value": "END" * 700}])
    auto = Constraint("structural_tag", json.dumps({"format": long_end}), grammar_backend="auto")
    assert preferred_order(auto)[0] == "llguidance"
    assert make_selecting().compile(auto).backend_name == "xgrammar"


def test_llguidance_names_a_content_that_does_not_compile():
    with pytest.raises(GrammarError, match=r"^format\.tags\[0\]\.content\.json_schema: "):
        make_llguidance_backend().compile(tag_constraint(tagged({"type": "json_schema",
                                                                 "json_schema": {"type": "strin"}})))
