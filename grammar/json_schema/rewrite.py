"""Rewrite a JSON schema into an equivalent or narrower one that xgrammar enforces fully.

Runs before the strictness check (grammar/xgrammar/schema_gaps.py). Many schemas are refused not because a keyword
cannot be enforced but because xgrammar cannot *read* the form it is written in (an `allOf`, a
keyword beside `$ref`, `required` in a schema without "type"). Each rule (RULES lists them; one
module per group) rewrites one such form; its docstring says whether it keeps the set of valid instances
(exact) or narrows it. No rule ever widens it. A rule that does not apply, or cannot be applied
exactly enough, leaves the node as it was, so the checker still reports it. Narrowing rules run
only where narrowing a subschema narrows the whole schema: not under `not`, `if`, `contains` or
a oneOf's branches (where a narrower branch can make an instance match one branch instead of two).

Pure JSON -> JSON; the input is not modified. Bounded: the output may grow to at most
MAX_GROWTH times the input (or MAX_MIN_BYTES), and the walk visits at most MAX_VISITS nodes;
past either a GrammarError names the limit, never a hang. The pass repeats until nothing
changes (at most MAX_PASSES), because one rule's output can be another's input.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grammar.backend import GrammarError
from grammar.json_schema import (arrays, conditional, conjunction, dependencies, inference, negation, pattern_names,
                                  patterns, property_names, scalars, unevaluated)
from grammar.json_schema.merge import copy_json
from grammar.json_schema.one_of import discriminated_one_of, exclusive_one_of
from grammar.json_schema.rule import RuleContext
from grammar.json_schema.walk import iter_subschemas, pointer_join, resolve_pointer

MAX_PASSES = 4
MAX_VISITS = 200_000
MAX_GROWTH = 8
MAX_MIN_BYTES = 256 * 1024

# in order: merging first (their output is what the later rules read), oneOf exclusivity last
# (the exact forms before the narrowing one)
RULES = (
    unevaluated.unevaluated_properties, property_names.property_names,
    conjunction.ref_siblings, conjunction.all_of, conjunction.distribute,
    conjunction.fixed_siblings, conditional.if_then_else, negation.not_rule, negation.false_patterns,
    negation.false_properties,
    dependencies.dependencies,
    inference.infer_type, inference.undeclared_required, pattern_names.declared_names_in_patterns,
    scalars.unknown_format,
    patterns.pattern_groups, patterns.classes_without_quotes, scalars.length_pattern,
    scalars.integral_multiple, scalars.int64_bounds,
    arrays.unique_items, exclusive_one_of, negation.one_of_by_negation, discriminated_one_of,
)

# then/else too: the conditional rule merges them with the node, whose keywords (its type...)
# make a narrowing there (an inferred type) needless
_NON_MONOTONE = ("not", "if", "then", "else", "contains", "oneOf")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SINGLES = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
            "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


@dataclass
class Rewritten:
    """A rewrite's result: the schema, what fired, and notes for the caller's not_enforced list."""

    schema: Any
    rules: Counter = field(default_factory=Counter)  # rule name -> times applied
    narrowed: list[str] = field(default_factory=list)  # "rule at pointer" for each narrowing
    notes: list[str] = field(default_factory=list)  # e.g. format names taken as annotations


def rewrite(schema: Any, enforced_formats: frozenset[str]) -> Rewritten:
    """The schema rewritten into forms xgrammar enforces, a `format` outside `enforced_formats`
    (the backend's) taken as an annotation; raises GrammarError on an empty `allOf` intersection
    or a blow-up past the limits (see the module docstring)."""
    limit = max(MAX_MIN_BYTES, MAX_GROWTH * len(json.dumps(schema)))
    context = RuleContext(enforced_formats=enforced_formats)
    out = copy_json(schema)
    for _ in range(MAX_PASSES):
        before = json.dumps(out, sort_keys=True)
        out = _Walk(context).run(out)
        if context.new_defs and isinstance(out, dict):
            out = {**out, "$defs": {**out.get("$defs", {}), **context.new_defs}}
            context.new_defs = {}
        after = json.dumps(out, sort_keys=True)
        if len(after) > limit:
            raise GrammarError(f"rewriting the schema for the grammar would make it {len(after)} bytes, over "
                               f"its limit of {limit}; simplify its allOf/$ref/dependencies")
        if after == before:
            break
    return Rewritten(out, context.rules, list(dict.fromkeys(context.narrowed)), list(dict.fromkeys(context.notes)))


class _Walk:
    """One pass over the schema: subschemas first, then RULES on the node."""

    def __init__(self, context: RuleContext) -> None:
        self.context = context
        self.visits = 0
        self.negated_targets: list[str] | None = []  # None: every definition

    def run(self, root: Any) -> Any:
        self.context.root = root
        self.negated_targets = _negated_targets(root)
        return self.node(root, "", True)

    def def_monotone(self, pointer: str) -> bool:
        """Whether the definition at `pointer` may be narrowed: no reference from a negated place
        reaches it (or a part of it), directly or through other definitions."""
        if self.negated_targets is None:
            return False
        return not any(t == pointer or t.startswith(pointer + "/") or pointer.startswith(t + "/")
                       for t in self.negated_targets)

    def node(self, node: Any, pointer: str, monotone: bool) -> Any:
        """`node` rewritten, subschemas first. `monotone`: narrowing this node narrows the whole
        schema; false under `not`, `if`, `contains` and a oneOf's branches, where narrowing a
        subschema can widen its parent, so only exact rules apply there."""
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise GrammarError(f"rewriting the schema for the grammar visited over {MAX_VISITS} subschemas; "
                               "simplify its $refs")
        if not isinstance(node, dict):
            return node
        node = dict(node)
        for key in _MAPS:
            if isinstance(node.get(key), dict):
                node[key] = {n: self.node(s, pointer_join(pointer, key, n),
                                          monotone and (key not in ("$defs", "definitions")
                                                        or self.def_monotone(pointer_join(pointer, key, n))))
                             for n, s in node[key].items()}
        for key in _SINGLES:
            if isinstance(node.get(key), (dict, bool)):
                node[key] = self.node(node[key], pointer_join(pointer, key), monotone and key not in _NON_MONOTONE)
        for key in _LISTS:
            if isinstance(node.get(key), list):
                inner = monotone and key not in _NON_MONOTONE
                node[key] = [self.node(s, pointer_join(pointer, key, i), inner) for i, s in enumerate(node[key])]
        if isinstance(node.get("dependencies"), dict):
            node["dependencies"] = {n: self.node(s, pointer_join(pointer, "dependencies", n), monotone)
                                    if isinstance(s, dict) else s for n, s in node["dependencies"].items()}
        self.context.monotone = monotone
        out: Any = node
        for rule in RULES:
            if not isinstance(out, dict):
                break
            out = rule(out, pointer, self.context)
        return out


def _negated_targets(root: Any) -> list[str] | None:
    """The pointers that references from a negated place (under not, if, then, else, contains or
    a oneOf's branches) reach, followed through the definitions they reach; None where one is
    not a plain local pointer (then no definition may be narrowed)."""
    refs = [n["$ref"] for p, n, _ in iter_subschemas(root)
            if isinstance(n, dict) and "$ref" in n and set(p.split("/")) & set(_NON_MONOTONE)]
    reached: set[str] = set()
    while refs:
        ref = refs.pop()
        if ref in reached:
            continue
        if not isinstance(ref, str) or not ref.startswith("#/") or "%" in ref:
            return None
        reached.add(ref)
        target = resolve_pointer(root, ref)
        refs += [n["$ref"] for _, n, _ in iter_subschemas(target) if isinstance(n, dict) and "$ref" in n]
    return [ref[1:] for ref in reached]
