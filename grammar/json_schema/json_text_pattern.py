"""A `pattern` that names a double quote or a backslash, rewritten to match its strings' JSON text.

xgrammar 0.2.9 matches a string schema's `pattern` against the string as it is written inside the
JSON document, not against its value: a pattern `^a"b$` would let the model write `"a"b"`, which
no JSON parser reads. What only includes them is safe (xgrammar leaves `"` and `\\` out of `.`,
`\\S`, `[^a]`, `[ -~]`: measured), so only what a pattern spells out needs rewriting: a quote
(`"`, `\\"`, `\\x22`, `\\u0022`) becomes the regex of the two characters `\\"`, a backslash
(`\\\\`, `\\x5c`, `\\u005c`) the regex of the two characters `\\\\`, and a class of only them the
alternation of those escapes. A negated class is left as it is: it cannot emit them (narrowing,
as `.` does). Measured: xgrammar drops an escape from an alternation that also has a branch
without one (`^(a|\\\\")$` rejects `"\\""`), so a class that holds them beside other members, and
any pattern with `|`, are not rewritten.

Exact for the value: every text the rewritten pattern matches is a valid JSON string body whose
value the original matches, and every value the original matches has its escaped text (the short
escapes, as `json.dumps` writes them) matched, but where a negated class, `.`, `\\S` and the like
stand for one of the two (they never emit them, a narrowing as before); the model's other
spellings (`\\u0022`) are not.
Forms this cannot rewrite (those, a range with a quote or backslash as an endpoint or spanning
them, back-references, the `[]` classes ECMA-262 and Python read differently) give None.
"""
from __future__ import annotations

from grammar.regex.pieces import regex_pieces

QUOTE_TEXT = '\\\\"'  # a regex for the two characters \"
BACKSLASH_TEXT = "\\\\\\\\"  # a regex for the two characters \\
_ESCAPED = {'"': QUOTE_TEXT, "\\": BACKSLASH_TEXT}
_CODES = {"x22": '"', "x5c": "\\", "u0022": '"', "u005c": "\\"}
_SPECIAL_CODES = {ord('"'), ord("\\")}
_HEX = set("0123456789abcdefABCDEF")


def names_quote_or_backslash(pattern: str) -> bool:
    """Whether `pattern` spells out a double quote or a backslash (itself, escaped, or by its code),
    outside or inside a class."""
    i = 0
    while i < len(pattern):
        if pattern[i] == '"':
            return True
        if pattern[i] == "\\":
            if _escape(pattern, i)[0] is not None:
                return True
            i += 2
            continue
        i += 1
    return False


def json_text_pattern(pattern: str) -> str | None:
    """`pattern` rewritten to match the JSON text of its strings (see the module docstring);
    unchanged if it names neither character, None where it cannot be rewritten exactly."""
    if not names_quote_or_backslash(pattern):
        return pattern
    if "[]" in pattern or "[^]" in pattern:
        return None
    if any(piece == "|" and not in_class for _, piece, in_class in regex_pieces(pattern)):
        return None  # measured: xgrammar drops an escape from an alternative beside one without
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            read = _class(pattern, i)
            if read is None:
                return None
            text, i = read
            out.append(text)
        elif char == "\\":
            named, width = _escape(pattern, i)
            if width == 0:
                return None  # a back-reference: the groups added below would renumber it
            out.append(f"({_ESCAPED[named]})" if named is not None else pattern[i:i + width])
            i += width
        elif char == '"':
            out.append(f"({QUOTE_TEXT})")
            i += 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _escape(pattern: str, i: int) -> tuple[str | None, int]:
    """(the quote or backslash the escape at i spells, or None; its width, 0 for a back-reference)."""
    nxt = pattern[i + 1:i + 2]
    if nxt in ('"', "\\"):
        return nxt, 2
    if nxt.isdigit() and nxt != "0":
        return None, 0
    digits = {"x": 2, "u": 4}.get(nxt, 0)
    code = pattern[i + 2:i + 2 + digits]
    if digits and len(code) == digits and all(c in _HEX for c in code):
        return _CODES.get(nxt + code.lower()), 2 + digits
    return None, 2


def _class(pattern: str, start: int) -> tuple[str, int] | None:
    """The class at `start` rewritten, and the index after it; None if it is unreadable, holds the
    quote or the backslash beside other members, or has a range that starts or ends with one."""
    read = _class_members(pattern, start)
    if read is None:
        return None
    negated, members, end = read
    named = [text for text, special in members if special]
    if negated or not named:  # a negated class excludes them, and xgrammar leaves them out anyway
        return pattern[start:end], end
    if len(named) < len(members):
        return None  # measured: xgrammar drops the escapes from an alternation beside the class
    return "(" + "|".join(_ESCAPED[c] for c in dict.fromkeys(named)) + ")", end


def _class_members(pattern: str, start: int) -> tuple[bool, list[tuple[str, bool]], int] | None:
    """(negated, its members, the index after it) of the class at `start`: each member's text (a
    range as "a-z") and whether it is the quote or the backslash (named as the character itself);
    None if unreadable or a range starts or ends with one of those two."""
    i = start + 1
    negated = pattern.startswith("^", i)
    i += negated
    members: list[tuple[str, bool]] = []
    while True:
        item = _class_item(pattern, i)
        if item is None:
            return None
        text, code, i = item
        if text == "]":
            return negated, members, i
        if pattern.startswith("-", i) and not pattern.startswith("-]", i):
            end = _class_item(pattern, i + 1)
            if end is None or {code, end[1]} & _SPECIAL_CODES:
                return None
            members.append((f"{text}-{end[0]}", False))
            i = end[2]
        elif code in _SPECIAL_CODES:
            members.append((chr(code), True))
        else:
            members.append((text, False))


def _class_item(pattern: str, i: int) -> tuple[str, int | None, int] | None:
    """(its text, the code of the one character it stands for or None, the index after it) of
    the class item at i; text "]" at the end of the class; None past the end of the pattern."""
    if i >= len(pattern):
        return None
    if pattern[i] != "\\":
        return pattern[i], ord(pattern[i]), i + 1
    named, width = _escape(pattern, i)
    if width == 0 or i + 1 >= len(pattern):
        return None
    text = pattern[i:i + width]
    if named is not None:
        return text, ord(named), i + width
    if width > 2:
        return text, int(text[2:], 16), i + width
    return text, (None if text[1].isalnum() else ord(text[1])), i + width


def classes_without_escapes(pattern: str) -> str | None:
    """`pattern` with the quote and the backslash taken out of every class that holds them beside
    other members (a narrowing: such a class is what json_text_pattern cannot hand to xgrammar,
    and `.` or a negated class already never emit them); None if no class changes, or one has a
    range that starts or ends with either."""
    if "[]" in pattern or "[^]" in pattern:
        return None
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif pattern[i] == "[":
            read = _class_without_escapes(pattern, i)
            if read is None:
                return None
            text, i = read
            out.append(text)
        else:
            out.append(pattern[i])
            i += 1
    narrower = "".join(out)
    return narrower if narrower != pattern else None


def _class_without_escapes(pattern: str, start: int) -> tuple[str, int] | None:
    """The class at `start` without its quote and backslash members if it has others, and the
    index after it; None if unreadable or a range ends in one of them."""
    read = _class_members(pattern, start)
    if read is None:
        return None
    negated, members, end = read
    kept = [text for text, special in members if not special]
    if negated or len(kept) == len(members) or not kept:
        return pattern[start:end], end
    if kept[0].startswith("^"):
        kept[0] = "\\" + kept[0]  # not a negation once it comes first
    return "[" + "".join(kept) + "]", end
