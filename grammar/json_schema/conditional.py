"""Rewrite rule for `if`/`then`/`else`, which neither backend enforces: written as the union it
means, "if and then, or not-if and else", each side merged with the node's other keywords.

Exact: an instance is valid against the conditional exactly when it is valid against `if` and
`then`, or invalid against `if` and valid against `else` (a missing `then`/`else` is true). The
negated side goes through not_rule at once: a condition it can complement (a discriminator's
const or enum, `required`, a type) leaves no `not` behind. One it cannot complement here stays a
`not`, exact as it is: a later pass may write it out once the node's own keywords are merged
around it (an allOf of conditionals), else the checker refuses it. A side that cannot be merged
leaves the node as it was.
"""
from __future__ import annotations

from typing import Any

from grammar.json_schema.merge import CannotMerge, EmptyIntersection, merge
from grammar.json_schema.negation import not_rule
from grammar.json_schema.rule import RuleContext, asserting, kept

_CONDITIONAL = ("if", "then", "else")


def if_then_else(node: dict, pointer: str, context: RuleContext) -> Any:
    """{"if": C, "then": T, "else": E, rest...} as anyOf [rest & C & T, rest & not C & E] (exact)."""
    if "if" not in node:
        return node
    base = asserting(node, *_CONDITIONAL)
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
                branch = not_rule(branch, pointer, context)
            if branch is not False and branch not in branches:
                branches.append(branch)
    except CannotMerge:
        return node
    context.fired("if", pointer)
    if not branches:
        return False
    if len(branches) == 1:
        return {**kept(node, *_CONDITIONAL), **branches[0]} if isinstance(branches[0], dict) else branches[0]
    return {**kept(node, *_CONDITIONAL), "anyOf": branches}
