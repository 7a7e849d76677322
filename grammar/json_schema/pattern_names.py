"""Property names that patterns tell apart: a proof that no name matches two `patternProperties`
patterns, and the rewrite rule for a declared property a pattern also matches.

JSON Schema checks a property against `properties[name]` and against every pattern that matches
its name (a search, not a full match). xgrammar checks a name against one of them, so a schema
passes its check only where that one is all there is: patterns no name matches two of, and a
declared name whose schema is the matching pattern's. The proof here is sufficient, never a
guess: two patterns anchored at the start (`^`) are told apart when, at some position every
match of each has a character, their character sets share none (`^x-` / `^y-`, `^[0-9]+$` /
`^[a-z]+$`).
"""
from __future__ import annotations

import itertools
import re
from typing import Any

from grammar.json_schema.merge import CannotMerge, merge
from grammar.json_schema.rule import RuleContext
from grammar.regex.characters import ClassMember, class_members, escaped_char, in_class_escape
from grammar.regex.parsed import Atom, RegexSyntaxError, parse_regex

_MAX_POSITIONS = 32  # leading characters compared
_MAX_RANGE_CHARS = 256  # a range checked character by character against a class escape, at most


def names_told_apart(first: str, second: str) -> bool:
    """Whether no string matches both patterns (search semantics; see the module docstring)."""
    a, b = _leading_sets(first), _leading_sets(second)
    if a is None or b is None:
        return False
    return all(any(_disjoint(x, y) for x, y in zip(left, right)) for left in a for right in b)


def overlapping_pattern_schemas(patterns: dict) -> bool:
    """Two patterns with different schemas that a name might match both of."""
    items = list(patterns.items())
    return any(s != t and not names_told_apart(p, q) for (p, s), (q, t) in itertools.combinations(items, 2))


def declared_names_in_patterns(node: dict, pointer: str, context: RuleContext) -> Any:
    """A declared property whose name a pattern matches gets that pattern's schema merged into
    its own (exact: both apply to it). Where its own asserted nothing beyond the pattern's, it
    becomes the pattern's schema, which is what xgrammar needs to enforce the pair."""
    patterns, declared = node.get("patternProperties"), node.get("properties")
    if not isinstance(patterns, dict) or not isinstance(declared, dict):
        return node
    changed = {}
    for name, schema in declared.items():
        try:
            matching = [s for p, s in patterns.items() if re.search(p, name)]
        except re.error:
            return node
        merged = schema
        try:
            for pattern_schema in matching:
                merged = merge(merged, pattern_schema)
        except CannotMerge:  # an empty intersection included: the checker names it
            continue
        if merged != schema:
            changed[name] = merged
    if not changed:
        return node
    context.fired("patternProperties-declared", pointer)
    return {**node, "properties": {**declared, **changed}}


# a character set: (negated, members); None: any character
CharSet = tuple[bool, list[ClassMember]] | None


def _leading_sets(pattern: str) -> list[list[CharSet]] | None:
    """Per alternative, the character sets of the positions every match starts with; None where
    an alternative is not anchored at the start (a search may match anywhere) or is not read."""
    try:
        parsed = parse_regex(pattern)
    except RecursionError:
        return None
    if not parsed:
        return None
    out = []
    for alternative in parsed:
        if not alternative or not (alternative[0].anchor and alternative[0].text == "^"):
            return None
        try:
            out.append(_positions(pattern, alternative[1:]))
        except RegexSyntaxError:
            return None
    return out


def _positions(pattern: str, atoms: list[Atom]) -> list[CharSet]:
    sets: list[CharSet] = []
    for atom in atoms:
        if atom.anchor or atom.alternatives or atom.low < 1 or atom.escape in ("b", "B") or atom.escape.isdigit():
            break  # what follows may start anywhere
        charset = _charset(pattern, atom.text)
        sets += [charset] * min(atom.low, _MAX_POSITIONS)
        if atom.high != atom.low or len(sets) >= _MAX_POSITIONS:
            break
    return sets


def _charset(pattern: str, text: str) -> CharSet:
    if text == ".":
        return None
    if text.startswith("["):
        return class_members(pattern, text)
    if text.startswith("\\"):
        char = escaped_char(text)
        return (False, [ClassMember(escape=text[1])]) if char is None else (False, [ClassMember(char, char)])
    return False, [ClassMember(text, text)]


def _disjoint(x: CharSet, y: CharSet) -> bool:
    if x is None or y is None:
        return False
    (x_negated, x_members), (y_negated, y_members) = x, y
    if x_negated and y_negated:
        return False
    if x_negated or y_negated:
        excluded, members = (x_members, y_members) if x_negated else (y_members, x_members)
        return all(_inside(member, excluded) for member in members)
    return all(_members_disjoint(a, b) for a in x_members for b in y_members)


def _members_disjoint(a: ClassMember, b: ClassMember) -> bool:
    if a.escape and b.escape:
        return a.escape != b.escape and a.escape.lower() == b.escape.lower()  # a class and its negation
    if a.escape or b.escape:
        escape, member = (a, b) if a.escape else (b, a)
        chars = _chars(member)
        return chars is not None and all(_escape_contains(escape.escape, c) is False for c in chars)
    return a.high < b.low or b.high < a.low


def _inside(member: ClassMember, excluded: list[ClassMember]) -> bool:
    """Every character of `member` is one of `excluded` (so a class negating them has none)."""
    chars = _chars(member)
    return chars is not None and all(
        any(_escape_contains(e.escape, c) if e.escape else e.low <= c <= e.high for e in excluded) for c in chars)


def _escape_contains(letter: str, char: str) -> bool | None:
    """Whether the class escape `letter` (d, w, D, W) matches `char` in both readings, ECMA-262's
    (ASCII digits and word characters) and Python's (Unicode): None where they may differ (a
    character past ASCII, and the whitespace escapes)."""
    if not char.isascii() or letter in "sS":
        return None
    return in_class_escape(char, letter)


def _chars(member: ClassMember) -> list[str] | None:
    if member.escape or ord(member.high) - ord(member.low) >= _MAX_RANGE_CHARS:
        return None
    return [chr(c) for c in range(ord(member.low), ord(member.high) + 1)]
