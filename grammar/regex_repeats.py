"""A regex terminal's large counted repeats made EBNF repetitions, so xgrammar compiles them once.

xgrammar 0.2.9 turns a `Regex("...")` terminal into one automaton in which `(?:\\S+\\s+){0,99}`
is 99 copies of the group's states, and computes a token mask for every state: 2.1 s for that
pattern alone (0.19 s for `{0,9}`). The same language written as EBNF repetition of the group,
`(Regex("^(?:\\S+\\s+)$")){0, 99}`, keeps one copy of the group's states (with a count beside
them) and compiles in about 15 ms.

The rewrite is exact: a fully anchored pattern `^A B{m,n} C$` (top-level items A, B, C, no
top-level `|`) matches a string exactly when the string splits into parts that `^A$`, `^B$` m to
n times, and `^C$` match, because each piece is a regular expression of its own once lookarounds,
back-references, word boundaries, inline flags and inner anchors (the constructs that look past a
piece's edges) are ruled out; such patterns are left as they are. Each piece stays a xgrammar
`Regex` with the original's `json_string` flag, so its characters mean what they meant before.
Pure text in, text out: the grammar text is xgrammar's own printing of a grammar.
"""
from __future__ import annotations

import re

from grammar.json_text_pattern import names_quote_or_backslash
from grammar.regex_pieces import quantifier, regex_pieces

MIN_NATIVE_COUNT = 8  # a counted repeat at least this large (either bound) is worth its own rule

_REGEX_RULE = re.compile(r'^(\S+) ::= Regex\("((?:[^"\\]|\\.)*)", json_string=(true|false)\)$', re.M)
_STRING_ESCAPES = {"\\": "\\", '"': '"', "?": "?", "n": "\n", "t": "\t", "r": "\r"}
_LOOKS_PAST_EDGES = re.compile(r"\\[bB1-9]|\(\?(?!:|P?<[A-Za-z_])|\\[AZz]")


def with_native_repeats(grammar_text: str, min_count: int = MIN_NATIVE_COUNT) -> str:
    """`grammar_text` with every whole-rule Regex terminal that has a top-level counted repeat of
    at least `min_count` written as EBNF around smaller Regex pieces; other rules unchanged."""

    def replace(match: re.Match) -> str:
        pattern = _unescape(match.group(2))
        expression = None if pattern is None else native_repeats(pattern, match.group(3), min_count)
        return match.group(0) if expression is None else f"{match.group(1)} ::= {expression}"

    return _REGEX_RULE.sub(replace, grammar_text)


def native_repeats(pattern: str, json_string: str = "true", min_count: int = MIN_NATIVE_COUNT) -> str | None:
    """The EBNF expression for the anchored `pattern` with its large counted repeats native, or
    None where the pattern has none or cannot be split exactly (see the module docstring)."""
    if not (pattern.startswith("^") and pattern.endswith("$")) or _LOOKS_PAST_EDGES.search(pattern):
        return None
    if names_quote_or_backslash(pattern):
        return None  # its JSON-text escapes are pairs of characters that must not be split
    body = pattern[1:-1]
    if body.endswith("\\") and (len(body) - len(body.rstrip("\\"))) % 2:
        return None  # the "$" was escaped: a literal dollar, not an anchor
    if any(piece in ("^", "$") and not in_class for _, piece, in_class in regex_pieces(body)):
        return None
    return _sequence(body, json_string, min_count)  # a top-level | would leave each anchor to one side


def _alternation(body: str, json_string: str, min_count: int) -> str | None:
    """EBNF for the unanchored `body` with its large repeats native; None: it has none, or a
    form this does not split."""
    branches = _branches(body)
    if branches is None:
        return None
    split = [_sequence(branch, json_string, min_count) for branch in branches]
    if all(s is None for s in split):
        return None
    if len(branches) == 1:
        return split[0]
    alternatives = [s or (_regex(b, json_string) if b else '""') for s, b in zip(split, branches)]
    return "(" + " | ".join(alternatives) + ")"


def _sequence(body: str, json_string: str, min_count: int) -> str | None:
    """EBNF for a `body` without a top-level `|`, split at its large repeats and at the groups
    that hold one; None: nothing worth splitting, or a form this does not split."""
    items = _items(body)
    if items is None:
        return None
    parts: list[str] = []
    plain = ""
    split_any = False
    for atom, text, low, high in items:
        inner = _group_body(atom)
        nested = None if inner is None else _alternation(inner, json_string, min_count)
        if nested is None and not _is_large(low, high, min_count):
            plain += text
            continue
        if (low, high) != (1, 1) and _matches_empty(atom):
            return None  # a repeat of a part that may be empty is ambiguous at every count
        split_any = True
        if plain:
            parts.append(_regex(plain, json_string))
            plain = ""
        element = nested or _regex(atom if inner is None else f"(?:{inner})", json_string)
        parts.append(element if (low, high) == (1, 1) else f"({element}){{{low}, {-1 if high is None else high}}}")
    if not split_any:
        return None
    if plain:
        parts.append(_regex(plain, json_string))
    return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"


def _branches(body: str) -> list[str] | None:
    """`body` split at its top-level `|`; None where its parentheses do not balance."""
    branches, start, depth = [], 0, 0
    for index, piece, in_class in regex_pieces(body):
        if in_class:
            continue
        if piece == "(":
            depth += 1
        elif piece == ")":
            depth -= 1
            if depth < 0:
                return None
        elif piece == "|" and depth == 0:
            branches.append(body[start:index])
            start = index + 1
    if depth:
        return None
    return [*branches, body[start:]]


def _is_large(low: int, high: int | None, min_count: int) -> bool:
    return low >= min_count or (high is not None and high >= min_count)


def _items(body: str) -> list[tuple[str, str, int, int | None]] | None:
    """(atom, atom with its quantifier, low, high) for each top-level item of `body`; None if it
    has a top-level `|` or a quantifier this does not read."""
    pieces = list(regex_pieces(body))
    items: list[tuple[str, str, int, int | None]] = []
    k = 0
    while k < len(pieces):
        start, piece, in_class = pieces[k]
        if piece in ("|", "*", "+", "?", "{") and not in_class:
            return None
        k += 1
        if piece == "[" and in_class:
            while k < len(pieces) and pieces[k][2]:
                k += 1
            k += 1  # the closing "]"
        elif piece == "(":
            depth = 1
            while k < len(pieces) and depth:
                _, inner, inner_in_class = pieces[k]
                if not inner_in_class:
                    depth += {"(": 1, ")": -1}.get(inner, 0)
                k += 1
            if depth:
                return None
        atom_end = pieces[k][0] if k < len(pieces) else len(body)
        low, high, end = quantifier(body, atom_end, len(body))
        if low < 0:
            return None
        while k < len(pieces) and pieces[k][0] < end:
            k += 1
        items.append((body[start:atom_end], body[start:end], low, high))
    return items


def _matches_empty(atom: str) -> bool:
    """Whether the atom can match the empty string (True where Python's re cannot read it)."""
    try:
        return re.fullmatch(atom, "") is not None
    except re.error:
        return True


def _group_body(atom: str) -> str | None:
    """The inside of a group atom (plain, non-capturing or named), None for any other atom."""
    if not (atom.startswith("(") and atom.endswith(")")):
        return None
    inner = atom[1:-1]
    named = re.match(r"\?P?<[A-Za-z_]\w*>|\?:", inner)
    return inner[named.end():] if named else inner


def _regex(pattern: str, json_string: str) -> str:
    return f'Regex("{_escape("^" + pattern + "$")}", json_string={json_string})'


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") \
        .replace("\r", "\\r")


def _unescape(text: str) -> str | None:
    """The pattern inside a printed Regex("..."); None for an escape this does not read."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        letter = text[i + 1]
        if letter in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[letter])
            i += 2
        elif letter in "xu" and re.fullmatch(r"[0-9a-fA-F]{%d}" % (2 if letter == "x" else 4),
                                             text[i + 2:i + (4 if letter == "x" else 6)]):
            width = 2 if letter == "x" else 4
            out.append(chr(int(text[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            return None
    return "".join(out)
