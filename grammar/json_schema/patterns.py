"""Rewrite rules for `pattern` text: the same regex, spelled so that xgrammar's regex engine reads
it right, and a class xgrammar cannot be handed narrowed into one it can (classes_without_quotes).

Measured (xgrammar 0.2.9, the JSON-schema path; its EBNF `from_regex` path is right): an optional
group whose body ends in a repeated atom admits the body without its start, e.g.
`^a(bc+)?$` accepts "ac" and `^\\d+(x[a-z_-]+)?$` accepts "5_". The same group written
`(...){0,1}` is read right, so every group quantifier `?` is spelled `{0,1}` (exact: the two mean
the same in every regex dialect; a lazy `??` becomes `{0,1}?`, matching the same strings).
"""
from __future__ import annotations

from typing import Any

from grammar.json_schema.json_text_pattern import classes_without_escapes, json_text_pattern
from grammar.json_schema.rule import RuleContext
from grammar.regex.pieces import regex_pieces


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


def hoisted_anchors(pattern: str) -> str:
    """`^A$|^B$` (each top-level alternative anchored at both ends, perhaps inside a group that
    wraps it) as `^(A|B)$`, an empty alternative as `{0,1}`: the same full matches, and xgrammar
    warns about (and ignores) an anchor inside a pattern. Unchanged for any other form."""
    back_references = any(p[1:2].isdigit() and p[1] != "0" for _, p, _ in regex_pieces(pattern))
    if "[]" in pattern or "[^]" in pattern or back_references:
        return pattern  # ECMA-262 and Python read these classes differently; back-references
    alternatives = _top_level_alternatives(pattern)
    if len(alternatives) < 2:
        return pattern
    bodies = []
    for alternative in alternatives:
        while alternative.startswith("(") and not alternative.startswith("(?") and \
                len(_top_level_alternatives(alternative[1:-1])) == 1 and _wraps(alternative):
            alternative = alternative[1:-1]
        pieces = [(piece, in_class) for _, piece, in_class in regex_pieces(alternative)]
        if len(pieces) < 2 or pieces[0] != ("^", False) or pieces[-1] != ("$", False):
            return pattern
        body = alternative[1:-1]
        if any(piece in "^$" and not in_class for _, piece, in_class in regex_pieces(body)) or \
                len(_top_level_alternatives(body)) > 1:
            return pattern
        bodies.append(body)
    kept = [b for b in dict.fromkeys(bodies) if b]
    if not kept:
        return "^$"
    return "^(" + "|".join(kept) + ")" + ("{0,1}" if "" in bodies else "") + "$"


def _top_level_alternatives(pattern: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, piece, in_class in regex_pieces(pattern):
        if in_class:
            continue
        depth += (piece == "(") - (piece == ")")
        if piece == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
    return [*parts, pattern[start:]]


def _wraps(group: str) -> bool:
    """Whether the "(" at the start of `group` closes at its end."""
    depth = 0
    for i, piece, in_class in regex_pieces(group):
        if not in_class:
            depth += (piece == "(") - (piece == ")")
            if depth == 0:
                return i == len(group) - 1
    return False


def pattern_groups(node: dict, pointer: str, context: RuleContext) -> Any:
    """Anchors inside `pattern` hoisted, and optional groups of `pattern` and of
    patternProperties' names spelled `{0,1}` (exact)."""
    out = node
    pattern = node.get("pattern")
    if isinstance(pattern, str) and optional_groups(hoisted_anchors(pattern)) != pattern:
        out = {**out, "pattern": optional_groups(hoisted_anchors(pattern))}
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and any(optional_groups(p) != p for p in patterns):
        renamed = {optional_groups(p): s for p, s in patterns.items()}
        if len(renamed) == len(patterns):
            out = {**out, "patternProperties": renamed}
    if out is not node:
        context.fired("optional-group", pointer)
    return out


def classes_without_quotes(node: dict, pointer: str, context: RuleContext) -> Any:
    """A `pattern` whose class holds a quote or a backslash beside other characters, which xgrammar
    cannot be handed (grammar/json_schema/json_text_pattern.py), with those two taken out of the class
    (narrowing: its strings never contain them there, as with `.` and negated classes)."""
    pattern = node.get("pattern")
    if not context.monotone or not isinstance(pattern, str) or json_text_pattern(pattern) is not None:
        return node
    narrower = classes_without_escapes(pattern)
    if narrower is None or json_text_pattern(narrower) is None:
        return node
    context.fired("class-without-quotes", pointer, narrowing=True)
    return {**node, "pattern": narrower}
