"""grammar/selection.py: which backend compiles a constraint, by name or picked ("auto")."""
from __future__ import annotations

import pytest
from grammar_factories import make_backend, make_constraint, make_llguidance_backend

from grammar.backend import CompiledGrammar, GrammarBackend, GrammarError, TooCostlyError, UnsupportedError
from grammar.config import GrammarConfig
from grammar.constraint import Constraint
from grammar.json_schema.walk import has_reference_cycle
from grammar.selection import XGRAMMAR_CHEAP_SPEC_CHARS, SelectingBackend, preferred_order

SMALL = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
# llguidance enforces it, xgrammar refuses it (a multipleOf that is no power of ten)
HALVES = {"type": "number", "multipleOf": 0.5}


def make_selecting(default: str = "auto") -> SelectingBackend:
    return SelectingBackend({"xgrammar": make_backend(), "llguidance": make_llguidance_backend()},
                            GrammarConfig(grammar_backend=default))


def large_schema(**extra) -> dict:
    """An object of many properties: its text is past what xgrammar compiles cheaply."""
    properties = {f"field_{i:03d}": {"type": "string", "maxLength": 20} for i in range(60)}
    return {"type": "object", "properties": properties, **extra}


def test_auto_takes_llguidance_for_a_schema_of_any_size():
    backend = make_selecting()
    assert backend.compile(make_constraint(spec=SMALL)).backend_name == "llguidance"
    large = make_constraint(spec=large_schema())
    assert len(large.spec) > XGRAMMAR_CHEAP_SPEC_CHARS
    assert backend.compile(large).backend_name == "llguidance"


def test_auto_tries_xgrammar_first_for_a_small_spec_of_another_kind_or_a_think_budget():
    assert preferred_order(Constraint("regex", "[a-z]+")) == ("xgrammar", "llguidance")
    assert preferred_order(Constraint("regex", "a" * (XGRAMMAR_CHEAP_SPEC_CHARS + 1)))[0] == "llguidance"
    assert preferred_order(make_constraint(spec=SMALL)) == ("llguidance", "xgrammar")
    budget = make_constraint(spec=SMALL, think_end="</think>", think_budget=16)
    assert preferred_order(budget) == ("xgrammar", "llguidance")  # only xgrammar forces the marker
    assert make_selecting().compile(budget).backend_name == "xgrammar"


def test_a_named_backend_compiles_it_whatever_the_default():
    backend = make_selecting("xgrammar")
    assert backend.compile(make_constraint(spec=SMALL)).backend_name == "xgrammar"
    compiled = backend.compile(make_constraint(spec=SMALL, grammar_backend="llguidance"))
    assert compiled.backend_name == "llguidance"
    grammar = backend.make_grammar(compiled)
    assert grammar.accept_tokens(make_backend().forced_text.encode('{"n":1}')) and grammar.is_terminated()


def test_a_server_default_of_one_backend_is_kept_even_where_auto_would_switch():
    with pytest.raises(GrammarError, match="multipleOf"):
        make_selecting("xgrammar").compile(make_constraint(spec=HALVES))


def test_auto_stays_strict_by_taking_the_backend_that_enforces_every_keyword():
    backend = make_selecting()
    assert backend.compile(make_constraint(spec=HALVES)).backend_name == "llguidance"
    # llguidance does not enforce propertyNames: a large schema with it goes to xgrammar
    names = make_constraint(spec=large_schema(propertyNames={"pattern": "^[a-z_0-9]+$"}))
    compiled = backend.compile(names)
    assert compiled.backend_name == "xgrammar" and compiled.not_enforced == []


def test_a_keyword_neither_enforces_is_refused_naming_both_backends():
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(GrammarError, match=r"uniqueItems.*\(llguidance: .*uniqueItems"):
        make_selecting().compile(make_constraint(spec=schema))


def test_best_effort_takes_the_backend_that_leaves_nothing_out():
    compiled = make_selecting().compile(make_constraint(spec=HALVES, strict=False))
    assert compiled.backend_name == "llguidance" and compiled.not_enforced == []


def test_a_think_budget_goes_to_xgrammar_which_forces_the_end_marker():
    constraint = make_constraint("regex", "(yes|no)", think_end="</think>", think_budget=8)
    assert make_selecting().compile(constraint).backend_name == "xgrammar"
    with pytest.raises(GrammarError, match="think_budget"):
        make_selecting().compile(make_constraint("regex", "(yes|no)", think_end="</think>", think_budget=8,
                                                 grammar_backend="llguidance"))


def test_an_unknown_backend_name_is_refused_with_the_names_it_takes():
    with pytest.raises(ValueError, match="auto, xgrammar, llguidance"):
        Constraint("regex", "a", grammar_backend="outlines").validate()
    with pytest.raises(ValueError, match="grammar_backend"):
        GrammarConfig(grammar_backend="outlines")


def test_the_backend_is_part_of_the_cache_key():
    assert Constraint("regex", "a").cache_key != Constraint("regex", "a", grammar_backend="llguidance").cache_key


class _Compiled(CompiledGrammar):
    num_bytes = 1

    def __init__(self, not_enforced: list[str] | None = None, min_output_tokens: int | None = 1) -> None:
        self.not_enforced = not_enforced or []
        self.min_output_tokens = min_output_tokens


class _ScriptedBackend(GrammarBackend):
    """Answers each compile with `outcome` (a GrammarError to raise, or not_enforced entries)."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.num_compiles = 0

    def compile(self, constraint):
        self.num_compiles += 1
        if isinstance(self.outcome, GrammarError):
            raise self.outcome
        if isinstance(self.outcome, _Compiled):
            return self.outcome
        return _Compiled(self.outcome)

    def make_grammar(self, compiled):
        raise NotImplementedError

    def allocate_bitmask(self, num_rows):
        raise NotImplementedError


def scripted(xgrammar_outcome, llguidance_outcome) -> tuple[SelectingBackend, dict[str, _ScriptedBackend]]:
    backends = {"xgrammar": _ScriptedBackend(xgrammar_outcome), "llguidance": _ScriptedBackend(llguidance_outcome)}
    return SelectingBackend(backends, GrammarConfig(grammar_backend="auto")), backends


LARGE = Constraint("regex", "a" * (XGRAMMAR_CHEAP_SPEC_CHARS + 1))


def test_a_large_spec_llguidance_refuses_falls_back_to_xgrammar_and_its_message():
    selecting, _ = scripted(None, GrammarError("llguidance cannot"))
    assert selecting.compile(LARGE).backend_name == "xgrammar"
    selecting, _ = scripted(GrammarError("xgrammar says why"), GrammarError("llguidance cannot"))
    with pytest.raises(GrammarError, match="^xgrammar says why$"):
        selecting.compile(LARGE)


def test_a_small_spec_xgrammar_refuses_as_invalid_is_not_retried():
    selecting, backends = scripted(GrammarError("bad spec"), None)
    with pytest.raises(GrammarError, match="^bad spec$"):
        selecting.compile(Constraint("regex", "a"))
    assert backends["llguidance"].num_compiles == 0


def test_masks_too_slow_on_xgrammar_are_built_by_llguidance():
    # an ambiguous repeat: xgrammar's fills take seconds a token or two in, llguidance's a few ms
    selecting, _ = scripted(TooCostlyError("regex: one bitmask fill takes 192 ms"), None)
    assert selecting.compile(Constraint("regex", r"(\w+ ?){1,50}")).backend_name == "llguidance"
    selecting, _ = scripted(TooCostlyError("regex: one bitmask fill takes 192 ms"), GrammarError("llguidance cannot"))
    with pytest.raises(GrammarError, match=r"^regex: one bitmask fill takes 192 ms \(llguidance: llguidance cannot\)$"):
        selecting.compile(Constraint("regex", r"(\w+ ?){1,50}"))
    selecting, backends = scripted(TooCostlyError("slow"), None)  # named, it stays refused
    with pytest.raises(TooCostlyError):
        selecting.compile(Constraint("regex", "a", grammar_backend="xgrammar"))
    assert backends["llguidance"].num_compiles == 0


def test_best_effort_keeps_the_first_when_the_other_leaves_out_as_much():
    selecting, backends = scripted(["uniqueItems at /"], ["uniqueItems at /"])
    assert selecting.compile(Constraint("regex", "a", strict=False)).backend_name == "xgrammar"
    assert backends["llguidance"].num_compiles == 1


def test_a_large_spec_without_a_known_shortest_output_on_llguidance_goes_to_xgrammar():
    # closing early needs the shortest output; xgrammar refuses one that never ends
    selecting, _ = scripted(None, _Compiled(min_output_tokens=None))
    assert selecting.compile(LARGE).backend_name == "xgrammar"
    selecting, _ = scripted(GrammarError("accepts no output of finite length"), _Compiled(min_output_tokens=None))
    with pytest.raises(GrammarError, match="^accepts no output of finite length$"):
        selecting.compile(LARGE)
    # a keyword xgrammar does not enforce: llguidance's grammar is all there is
    selecting, _ = scripted(UnsupportedError("multipleOf"), _Compiled(min_output_tokens=None))
    assert selecting.compile(LARGE).backend_name == "llguidance"
    selecting, backends = scripted(None, _Compiled(min_output_tokens=40))
    assert selecting.compile(LARGE).backend_name == "llguidance" and backends["xgrammar"].num_compiles == 0


def test_a_large_schema_that_never_ends_is_refused_under_auto():
    # a required child of the object's own shape: no finite output; past the size llguidance starts
    schema = large_schema(properties={**large_schema()["properties"], "child": {"$ref": "#"}},
                          required=["child"])
    constraint = make_constraint(spec=schema)
    assert len(constraint.spec) > XGRAMMAR_CHEAP_SPEC_CHARS
    with pytest.raises(GrammarError, match="finite length"):  # read from the schema, before a search
        make_llguidance_backend().compile(constraint)
    with pytest.raises(GrammarError, match="finite length|never end"):
        make_selecting().compile(constraint)


def test_the_default_is_auto():
    assert GrammarConfig().grammar_backend == "auto"


def test_a_schema_that_refers_to_itself_stays_with_the_size_rule():
    # llguidance finds a shortest output for it (the optional "a" left out) and would serve the part
    # that never ends; xgrammar, first for a small spec, refuses it
    inner_loop = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"$ref": "#/properties/a"}},
                                                         "required": ["b"]}}}
    with pytest.raises(GrammarError, match="never end"):
        make_selecting().compile(make_constraint(spec=inner_loop))
    shared = {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}, "required": ["x"]}
    assert make_selecting().compile(make_constraint(spec=shared)).backend_name == "llguidance"



@pytest.mark.parametrize("schema, cycle", [
    ({"properties": {"child": {"$ref": "#"}}}, True),
    ({"$defs": {"x": {"properties": {"n": {"$ref": "#/$defs/y"}}}, "y": {"items": {"$ref": "#/$defs/x"}}},
      "properties": {"a": {"$ref": "#/$defs/y"}}}, True),
    ({"$defs": {"x": {"type": "integer"}, "y": {"$ref": "#/$defs/x"}}, "properties": {"a": {"$ref": "#/$defs/y"}}},
     False),
    ({"$ref": "other.json#/x"}, True),  # not followed: taken as possibly recursive
    ({"type": "string"}, False),
])
def test_reference_cycles_are_found_through_the_subschemas_refs_name(schema, cycle):
    assert has_reference_cycle(schema) is cycle
