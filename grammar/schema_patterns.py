"""Rewrite rule for `pattern` text: the same regex, spelled so that xgrammar's regex engine reads
it right.

Measured (xgrammar 0.2.9, the JSON-schema path; its EBNF `from_regex` path is right): an optional
group whose body ends in a repeated atom admits the body without its start, e.g.
`^a(bc+)?$` accepts "ac" and `^\\d+(x[a-z_-]+)?$` accepts "5_". The same group written
`(...){0,1}` is read right, so every group quantifier `?` is spelled `{0,1}` (exact: the two mean
the same in every regex dialect; a lazy `??` becomes `{0,1}?`, matching the same strings).
"""
from __future__ import annotations

from typing import Any

from grammar.regex_pieces import regex_pieces
from grammar.schema_rule import RuleContext


def optional_groups(pattern: str) -> str:
    """`pattern` with each `)?` (a group made optional) written `){0,1}`; unchanged if it has a
    class that ECMA-262 and Python read differently (`[]`, `[^]`)."""
    if "[]" in pattern or "[^]" in pattern:
        return pattern
    out, skip = [], False
    for i, piece, in_class in regex_pieces(pattern):
        if skip:
            skip = False
        elif not in_class and piece == ")" and pattern.startswith("?", i + 1):
            out.append("){0,1}")
            skip = True
        else:
            out.append(piece)
    return "".join(out)


def pattern_groups(node: dict, pointer: str, context: RuleContext) -> Any:
    """Optional groups of `pattern` and of patternProperties' names spelled `{0,1}` (exact)."""
    out = node
    pattern = node.get("pattern")
    if isinstance(pattern, str) and optional_groups(pattern) != pattern:
        out = {**out, "pattern": optional_groups(pattern)}
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and any(optional_groups(p) != p for p in patterns):
        renamed = {optional_groups(p): s for p, s in patterns.items()}
        if len(renamed) == len(patterns):
            out = {**out, "patternProperties": renamed}
    if out is not node:
        context.fired("optional-group", pointer)
    return out
