"""Rewrite rules for `pattern` text: the same regex, spelled so that xgrammar's regex engine reads
it right, and a class xgrammar cannot be handed narrowed into one it can (classes_without_quotes).

Measured (xgrammar 0.2.9, the JSON-schema path; its EBNF `from_regex` path is right): an optional
group whose body ends in a repeated atom admits the body without its start, e.g.
`^a(bc+)?$` accepts "ac" and `^\\d+(x[a-z_-]+)?$` accepts "5_". The same group written
`(...){0,1}` is read right, so every group quantifier `?` is spelled `{0,1}` (exact: the two mean
the same in every regex dialect; a lazy `??` becomes `{0,1}?`, matching the same strings).
"""
from __future__ import annotations

import re
from typing import Any

from grammar.json_schema.json_text_pattern import classes_without_escapes, json_text_pattern
from grammar.json_schema.rule import RuleContext
from grammar.regex.parsed import Atom, parse_regex, render, walk


def optional_groups(pattern: str) -> str:
    """`pattern` with each `)?` (a group made optional) written `){0,1}`; unchanged if it has a
    class that ECMA-262 and Python read differently (`[]`, `[^]`), or the parsed form refuses it
    (so does xgrammar's regex reader)."""
    parsed = None if "[]" in pattern or "[^]" in pattern else parse_regex(pattern)
    if parsed is None:
        return pattern
    for atom in (a for sequence in parsed for a in walk(sequence)):
        if atom.alternatives and atom.quantifier_text in ("?", "??"):
            atom.quantifier_text = "{0,1}" + atom.quantifier_text[1:]  # the same counts, lazy kept
    return "|".join(render(sequence) for sequence in parsed)


def hoisted_anchors(pattern: str) -> str:
    """`^A$|^B$` (each top-level alternative anchored at both ends, perhaps inside a group that
    wraps it) as `^(A|B)$`, an empty alternative as `{0,1}`: the same full matches, and xgrammar
    warns about (and ignores) an anchor inside a pattern. Unchanged for any other form."""
    parsed = None if "[]" in pattern or "[^]" in pattern else parse_regex(pattern)
    if parsed is None or len(parsed) < 2 or _back_references(parsed):
        return pattern  # ECMA-262 and Python read these classes differently; groups may not be renumbered
    bodies = []
    for alternative in parsed:
        while len(alternative) == 1 and _plain_group(alternative[0]):
            alternative = alternative[0].alternatives[0]
        if len(alternative) < 2 or not (_is_anchor(alternative[0], "^") and _is_anchor(alternative[-1], "$")):
            return pattern
        body = alternative[1:-1]
        if any(atom.anchor for atom in walk(body)):
            return pattern
        bodies.append(render(body))
    kept = [b for b in dict.fromkeys(bodies) if b]
    if not kept:
        return "^$"
    return "^(" + "|".join(kept) + ")" + ("{0,1}" if "" in bodies else "") + "$"


def _plain_group(atom: Atom) -> bool:
    """A capturing group of one alternative, matched once: `(A)`."""
    return atom.text == "(" and len(atom.alternatives) == 1 and atom.quantifier_text == ""


def _is_anchor(atom: Atom, text: str) -> bool:
    return atom.anchor and atom.text == text


def _back_references(parsed: list[list[Atom]]) -> bool:
    """An escape \\1 to \\9 anywhere, in a class too, as this rule has always read them."""
    for atom in (a for sequence in parsed for a in walk(sequence)):
        escapes = re.findall(r"\\(.)", atom.text) if atom.text.startswith("[") else [atom.escape]
        if any(letter.isdigit() and letter != "0" for letter in escapes):
            return True
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
