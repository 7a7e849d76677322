"""Rewrite rule for `if`/`then`/`else`, which neither backend enforces: written as the union it
means, "if and then, or not-if and else", each side merged with the node's other keywords.

Exact: an instance is valid against the conditional exactly when it is valid against `if` and
`then`, or invalid against `if` and valid against `else` (a missing `then`/`else` is true). The
negated side goes through not_rule at once: a condition it can complement (a discriminator's
const or enum, `required`, a type) leaves no `not` behind. Where a `not` would stay, or a side
cannot be merged, the node is left as it was, for the checker to name its `if`.
"""
from __future__ import annotations

from typing import Any

from grammar.json_schema.merge import CannotMerge, EmptyIntersection, merge
from grammar.json_schema.negation import not_rule
from grammar.json_schema.rule import RuleContext, asserting, kept, walk_json

_CONDITIONAL = ("if", "then", "else")


def if_then_else(node: dict, pointer: str, context: RuleContext) -> Any:
    """{"if": C, "then": T, "else": E, rest...} as anyOf [rest & C & T, rest & not C & E] (exact)."""
    if "if" not in node:
        return node
    base = asserting(node, *_CONDITIONAL)
    scratch = RuleContext(root=context.root, monotone=context.monotone)  # reported only if it applies
    try:
        condition = context.resolved(node["if"])
        sides = [(condition, context.resolved(node.get("then", True))),
                 ({"not": condition} if isinstance(condition, dict) else not condition,
                  context.resolved(node.get("else", True)))]
        branches = []
        for test, outcome in sides:
            try:
                branch = merge(merge(base, test), outcome)
            except EmptyIntersection:
                continue
            if isinstance(branch, dict) and "not" in branch:
                branch = not_rule(branch, pointer, scratch)
                if any(isinstance(n, dict) and "not" in n for n in walk_json(branch)):
                    return node
            if branch is not False and branch not in branches:
                branches.append(branch)
    except CannotMerge:
        return node
    context.rules.update(scratch.rules)
    context.narrowed += scratch.narrowed
    context.fired("if", pointer)
    if not branches:
        return False
    if len(branches) == 1:
        return {**kept(node, *_CONDITIONAL), **branches[0]} if isinstance(branches[0], dict) else branches[0]
    return {**kept(node, *_CONDITIONAL), "anyOf": branches}
