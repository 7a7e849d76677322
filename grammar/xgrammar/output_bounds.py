"""How much output a grammar needs: the static check that keeps jump-forward and matchers bounded.

A grammar can force text without end (a required property whose schema is its own parent:
`{"child": {"child": ...`), or force far more text than any request can hold (`(a{1000}){1000}`
forces a million "a"s). Jump-forward asks the matcher for the text the grammar forces next, and
the matcher builds that text in one call that cannot be interrupted, so such a grammar must be
refused before any request uses it. Two numbers decide it, both computed here from the grammar's
rules without running the matcher:

* the shortest output of every rule (infinite for a rule that can never finish), and
* `max_required_bytes`: the most bytes any point of one rule still needs before that rule can
  finish, counting the shortest expansion of every rule it refers to. The text forced at any
  point is a prefix of every way to finish, so it is never longer than what the rules open at
  that point still need; each rule level is bounded by this number, and nesting adds a level only
  where the output itself opened one.

Rules are read from xgrammar's own serialization (`Grammar.serialize_json`), a plain JSON
document, so this module imports no grammar library. An element it does not know makes the
result inexact (`exact=False`): its minimums are then lower bounds only, which can never refuse a
good grammar, and the caller must not trust `max_required_bytes` for jump-forward.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INFINITE = math.inf

# xgrammar's GrammarExprType codes (cpp/grammar_impl.h), serialization format "v18"
SERIALIZATION_VERSIONS = ("v18",)
_BYTE_STRING, _CHAR_CLASS, _CHAR_CLASS_STAR, _EMPTY, _RULE_REF, _SEQUENCE, _CHOICES = range(7)
_TAG_DISPATCH, _REPEAT, _TOKEN, _EXCLUDE_TOKEN, _TOKEN_TAG_DISPATCH, _REGEX = range(7, 13)
_MAX_EXPR_NESTING = 64  # rule bodies are flat after xgrammar's normalization; deeper is not analysed


@dataclass(frozen=True)
class OutputBounds:
    """What the rules of one grammar need (bytes of output)."""

    min_bytes: float  # the shortest complete output; INFINITE if there is none
    max_required_bytes: float  # the most any point of one rule level still needs (see the module doc)
    dead_rule: str | None  # a reachable rule with no finite expansion, if any
    exact: bool  # False: an element was not understood; the minimums are lower bounds only


# what a grammar's nested regex element needs: (its bounds) for a regex pattern
RegexBounds = Callable[[str], OutputBounds]


def analyze(serialized: dict[str, Any], regex_bounds: RegexBounds) -> OutputBounds:
    """The bounds of a grammar given as xgrammar's `serialize_json()` document.

    `regex_bounds` analyses the pattern of a regex element (a JSON-schema "pattern"), which
    xgrammar keeps as one opaque element.
    """
    if serialized.get("__VERSION__") not in SERIALIZATION_VERSIONS:
        return OutputBounds(0, 0, None, exact=False)
    grammar = _Rules(serialized, regex_bounds)
    minimums = grammar.rule_minimums()
    reachable = grammar.reachable(grammar.root)
    dead = next((grammar.names[r] for r in reachable if minimums[r] == INFINITE), None)
    required = max((grammar.required(grammar.bodies[r], minimums, 0) for r in reachable), default=0.0)
    required = max([required] + [b.max_required_bytes for b in grammar.regex_cache.values()])
    return OutputBounds(minimums[grammar.root], required, dead, grammar.exact)


class _Rules:
    """The rule table of a serialized grammar, with the expression evaluators."""

    def __init__(self, serialized: dict[str, Any], regex_bounds: RegexBounds) -> None:
        self.names = [rule[0] for rule in serialized["rules"]]
        self.bodies = [int(rule[1]) for rule in serialized["rules"]]
        self.root = int(serialized["root_rule_id"])
        self._data = serialized["grammar_expr_data"]
        self._indptr = serialized["grammar_expr_indptr"]
        self._regex_bounds = regex_bounds
        self.regex_cache: dict[str, OutputBounds] = {}
        self.exact = True

    def expr(self, expr_id: int) -> tuple[int, list[int]]:
        start = self._indptr[expr_id]
        length = self._data[start + 1]
        return self._data[start], self._data[start + 2:start + 2 + length]

    def refs(self, expr_id: int, depth: int = 0) -> set[int]:
        """Rules an expression refers to (through references and repeats)."""
        kind, payload = self.expr(expr_id)
        if kind in (_RULE_REF, _REPEAT):
            return {payload[0]}
        if kind in (_SEQUENCE, _CHOICES) and depth < _MAX_EXPR_NESTING:
            return set().union(*(self.refs(e, depth + 1) for e in payload)) if payload else set()
        if kind == _TAG_DISPATCH:  # [tag expr, rule, tag expr, rule, ..., loop flag, excluded expr]
            return set(payload[1:-2:2])
        if kind == _TOKEN_TAG_DISPATCH and payload:  # [count, (token, rule) * count, ...]
            return set(payload[2:2 + 2 * payload[0]:2])
        return set()

    def reachable(self, root: int) -> list[int]:
        seen = {root}
        stack = [root]
        while stack:
            for rule in self.refs(self.bodies[stack.pop()]):
                if rule not in seen:
                    seen.add(rule)
                    stack.append(rule)
        return sorted(seen)

    def minimum(self, expr_id: int, rule_min: list[float], depth: int) -> float:
        """The shortest output of an expression, given the rules' shortest outputs so far."""
        kind, payload = self.expr(expr_id)
        if kind == _BYTE_STRING:
            return float(len(payload))
        if kind == _CHAR_CLASS:
            return 1.0
        if kind in (_CHAR_CLASS_STAR, _EMPTY):
            return 0.0
        if kind == _RULE_REF:
            return rule_min[payload[0]]
        if kind == _REPEAT:
            count = payload[1]
            return 0.0 if count <= 0 else count * rule_min[payload[0]]
        if kind == _REGEX:
            return self.regex(payload).min_bytes
        if kind in (_SEQUENCE, _CHOICES) and depth < _MAX_EXPR_NESTING:
            parts = [self.minimum(e, rule_min, depth + 1) for e in payload]
            if kind == _SEQUENCE:
                return sum(parts)
            return min(parts, default=INFINITE)
        self.exact = False  # tags, token elements, or nesting we do not follow: assume nothing
        return 0.0

    def required(self, expr_id: int, rule_min: list[float], depth: int) -> float:
        """The most output still needed from any point of this expression's own level."""
        kind, payload = self.expr(expr_id)
        if kind == _SEQUENCE and depth < _MAX_EXPR_NESTING:
            worst, rest = 0.0, 0.0
            for e in reversed(payload):  # suffix sums: the point before e needs e's part plus the rest
                worst = max(worst, self.required(e, rule_min, depth + 1) + rest)
                rest += self.minimum(e, rule_min, depth + 1)
            return worst
        if kind == _CHOICES and depth < _MAX_EXPR_NESTING:
            return max((self.required(e, rule_min, depth + 1) for e in payload), default=0.0)
        if kind == _REGEX:
            return self.regex(payload).min_bytes
        return self.minimum(expr_id, rule_min, depth)

    def regex(self, payload: list[int]) -> OutputBounds:
        pattern = bytes(payload[1:]).decode("utf-8", errors="replace")  # payload[0]: the json_string flag
        bounds = self.regex_cache.get(pattern)
        if bounds is None:
            bounds = self.regex_cache[pattern] = self._regex_bounds(pattern)
            self.exact = self.exact and bounds.exact
        return bounds

    def rule_minimums(self) -> list[float]:
        """Every rule's shortest output, by Knuth's generalization of Dijkstra's algorithm.

        Sums, repeats and choices never give less than the rules they use, so the rule with the
        smallest tentative value is final; each final rule updates only the rules that use it.
        """
        num_rules = len(self.bodies)
        users: list[set[int]] = [set() for _ in range(num_rules)]
        for rule, body in enumerate(self.bodies):
            for used in self.refs(body):
                users[used].add(rule)
        final = [INFINITE] * num_rules
        tentative = [INFINITE] * num_rules
        heap: list[tuple[float, int]] = []
        for rule, body in enumerate(self.bodies):
            tentative[rule] = self.minimum(body, final, 0)
            if tentative[rule] < INFINITE:
                heap.append((tentative[rule], rule))
        heapq.heapify(heap)
        done = [False] * num_rules
        while heap:
            value, rule = heapq.heappop(heap)
            if done[rule] or value > tentative[rule]:
                continue
            done[rule] = True
            final[rule] = value
            for user in users[rule]:
                if not done[user]:
                    candidate = self.minimum(self.bodies[user], final, 0)
                    if candidate < tentative[user]:
                        tentative[user] = candidate
                        heapq.heappush(heap, (candidate, user))
        return final
