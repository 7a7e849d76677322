"""Length bounds beside a pattern with groups and alternation, folded by capping its repeats.

The fold of grammar/regex/length_pattern.py reads a sequence of single-character atoms. A pattern with
groups (`^(?:\\S+\\s+){0,29}\\S+$`, "at most 30 words", beside `maxLength: 300`) has no regex
that is exactly "the pattern and the bounds" short enough to write, so this writes a narrower
one: every unbounded repeat gets the same cap K, the largest for which the pattern's longest
match fits maxLength (a repeat of whitespace, a separator, is capped at one turn first, so the
budget goes to the content: `^(?:\\S{1,9}\\s){0,29}\\S{1,9}$`); then,
in each top-level alternative still too short for minLength, one repeat of a fixed-width body
gets a higher minimum. Alternatives that cannot meet the bounds at all are dropped (exact).
Narrowing, always (flagged by the caller); None for what is not modelled: lookaround,
back-references, anchors anywhere but at the ends of each top-level alternative.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grammar.regex.pieces import quantifier

MAX_REPEATS = 200  # repeats in one pattern, past which it is not read
_ZERO_WIDTH_ESCAPES = set("bBAzZG")


@dataclass
class _Repeat:
    """One atom and its quantifier: a character unit (`text`) or a group (`alternatives`)."""

    text: str  # the atom as written ("(" or "(?:" for a group)
    low: int
    high: int | None  # None: unbounded
    quantifier_text: str  # as written, kept while the counts are unchanged
    alternatives: list[list[_Repeat]] = field(default_factory=list)
    anchor: bool = False  # "^" or "$"
    separator: bool = False  # whitespace, repeated: capped at one turn first

    def __post_init__(self) -> None:
        self.written = (self.low, self.high)  # the counts as the pattern wrote them

    @property
    def unbounded(self) -> bool:
        return self.written[1] is None

    def render(self) -> str:
        if self.anchor:
            return self.text
        body = self.text + ("|".join(_render(a) for a in self.alternatives) + ")" if self.alternatives else "")
        return body + self._quantifier()

    def _quantifier(self) -> str:
        if (self.low, self.high) == self.written:
            return self.quantifier_text
        if (self.low, self.high) == (1, 1):
            return ""
        if self.high is None:
            return {0: "*", 1: "+"}.get(self.low, f"{{{self.low},}}")
        return f"{{{self.low}}}" if self.low == self.high else f"{{{self.low},{self.high}}}"


def cap_lengths(pattern: str, min_length: int, max_length: int | None) -> tuple[str, bool] | None:
    """(`pattern` narrowed so that every match has a length within the bounds, whether that is
    narrower than pattern + bounds) (see the module docstring), or None where it cannot be read
    or no match can have an allowed length. Exact when one alternative is left with one repeat
    of a variable count, of a fixed-width body, inside no other repeat: its counts then say
    exactly which lengths the bounds allow."""
    if "[]" in pattern or "[^]" in pattern:
        return None
    parser = _Parser(pattern)
    parsed = parser.alternatives()
    if parsed is None or parser.i != len(pattern) or \
            not all(_starts_anchored(b) and _ends_anchored(b) for b in parsed):
        return None
    anchors = {id(r) for b in parsed for r in _walk(b) if r.anchor}
    if anchors != set().union(*(_edge_anchors(b, True, True) for b in parsed)):
        return None  # an anchor inside: not modelled
    # alternatives no match of which has an allowed length are dropped (exact)
    parsed = [b for b in parsed if (max_length is None or _lengths(b)[0] <= max_length)
              and (_lengths(b)[1] is None or _lengths(b)[1] >= min_length)]  # type: ignore[operator]
    if not parsed:
        return None
    repeats = [r for b in parsed for r in _walk(b)]
    variable = [r for r in repeats if not r.anchor and r.low != r.high]
    exact = len(parsed) == 1 and (not variable or len(variable) == 1 and _body_width(variable[0]) is not None
                                  and any(r is variable[0] for r in _walk(parsed[0], outside_repeats=True)))
    if max_length is not None:
        for repeat in repeats:
            if repeat.unbounded and repeat.separator and not exact:
                repeat.high = max(repeat.low, 1)
        if _cap(parsed, repeats, max_length) is None:
            return None
    kept = []
    for branch in parsed:
        low, high = _lengths(branch)
        if (max_length is not None and low > max_length) or (high is not None and high < min_length):
            continue  # no match of this alternative has an allowed length
        if low < min_length and not _raise_minimum(branch, min_length - low):
            return None
        kept.append(branch)
    return ("|".join(_render(b) for b in kept), not exact) if kept else None


def _cap(parsed: list[list[_Repeat]], repeats: list[_Repeat], max_length: int) -> int | None:
    """Sets the largest cap K under which the longest match fits max_length; None if none does."""
    open_repeats = [r for r in repeats if r.unbounded and r.high is None]

    def longest(cap: int) -> int | None:
        for repeat in open_repeats:
            repeat.high = max(repeat.low, cap)
        return max(_lengths(b)[1] for b in parsed)  # type: ignore[type-var]

    if longest(0) > max_length:  # type: ignore[operator]
        return None
    low, high = 0, max_length
    while low < high:  # the largest cap that fits
        middle = (low + high + 1) // 2
        if longest(middle) <= max_length:  # type: ignore[operator]
            low = middle
        else:
            high = middle - 1
    longest(low)
    return low


def _raise_minimum(branch: list[_Repeat], deficit: int) -> bool:
    """Raise the minimum of the top-level repeat of a fixed-width body with the most room (inside
    a group that wraps the whole branch too) so that the branch's shortest match grows by at
    least `deficit`; False if none can."""
    if len(branch) == 1 and branch[0].alternatives and len(branch[0].alternatives) == 1 and \
            (branch[0].low, branch[0].high) == (1, 1):
        return _raise_minimum(branch[0].alternatives[0], deficit)
    candidates = []
    for repeat in branch:
        width = _body_width(repeat)
        if repeat.anchor or not width:
            continue
        room = float("inf") if repeat.high is None else (repeat.high - repeat.low) * width
        if room >= deficit:
            candidates.append((room, repeat, width))
    if not candidates:
        return False
    _, best, width = max(candidates, key=lambda c: c[0])
    best.low += -(-deficit // width)
    return True


def _body_width(repeat: _Repeat) -> int | None:
    if not repeat.alternatives:
        return 0 if repeat.anchor else 1
    lengths = [_lengths(a) for a in repeat.alternatives]
    widths = {low for low, high in lengths if low == high}
    return widths.pop() if len(widths) == 1 and all(low == high for low, high in lengths) else None


def _lengths(sequence: list[_Repeat]) -> tuple[int, int | None]:
    """(shortest, longest or None) length of the sequence's matches."""
    low, high = 0, 0
    for repeat in sequence:
        if repeat.anchor:
            continue
        if repeat.alternatives:
            inner = [_lengths(a) for a in repeat.alternatives]
            body_low = min(i[0] for i in inner)
            body_high = None if any(i[1] is None for i in inner) else max(i[1] for i in inner)  # type: ignore[type-var]
        else:
            body_low = body_high = 1
        low += repeat.low * body_low
        if high is not None:
            high = None if repeat.high is None or body_high is None else high + repeat.high * body_high
    return low, high


def _walk(sequence: list[_Repeat], outside_repeats: bool = False):
    """Every repeat of the sequence, nested ones too (with `outside_repeats`: only those inside
    groups that match once)."""
    for repeat in sequence:
        yield repeat
        if outside_repeats and (repeat.low, repeat.high) != (1, 1):
            continue
        for alternative in repeat.alternatives:
            yield from _walk(alternative, outside_repeats)


def _edge_anchors(sequence: list[_Repeat], at_start: bool, at_end: bool) -> set[int]:
    """The ids of the anchors that stand at the start / end of every match of the sequence."""
    out: set[int] = set()
    for index, repeat in enumerate(sequence):
        first, last = at_start and index == 0, at_end and index == len(sequence) - 1
        if repeat.anchor and ((repeat.text == "^" and first) or (repeat.text == "$" and last)):
            out.add(id(repeat))
        if repeat.alternatives and (repeat.low, repeat.high) == (1, 1):
            for alternative in repeat.alternatives:
                out |= _edge_anchors(alternative, first, last)
    return out


def _starts_anchored(sequence: list[_Repeat]) -> bool:
    if not sequence:
        return False
    first = sequence[0]
    if first.anchor:
        return first.text == "^"
    return bool(first.alternatives) and (first.low, first.high) == (1, 1) and all(
        _starts_anchored(a) for a in first.alternatives)


def _ends_anchored(sequence: list[_Repeat]) -> bool:
    if not sequence:
        return False
    last = sequence[-1]
    if last.anchor:
        return last.text == "$"
    return bool(last.alternatives) and (last.low, last.high) == (1, 1) and all(
        _ends_anchored(a) for a in last.alternatives)


def _render(sequence: list[_Repeat]) -> str:
    return "".join(r.render() for r in sequence)


class _Parser:
    """A recursive reader of the regex subset above; None from any method: not modelled."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.i = 0
        self.num_repeats = 0

    def alternatives(self) -> list[list[_Repeat]] | None:
        out: list[list[_Repeat]] = [[]]
        pattern = self.pattern
        while self.i < len(pattern) and pattern[self.i] != ")":
            if pattern[self.i] == "|":
                out.append([])
                self.i += 1
                continue
            repeat = self.repeat()
            if repeat is None:
                return None
            out[-1].append(repeat)
        return out

    def repeat(self) -> _Repeat | None:
        pattern, start = self.pattern, self.i
        self.num_repeats += 1
        if self.num_repeats > MAX_REPEATS:
            return None
        char = pattern[start]
        alternatives: list[list[_Repeat]] = []
        if char in "^$":
            self.i += 1
            return _Repeat(char, 1, 1, "", anchor=True)
        if char == "(":
            opener = "(?:" if pattern.startswith("(?:", start) else "("
            if pattern.startswith("(?", start) and opener == "(":
                return None  # lookaround, named groups, flags
            self.i += len(opener)
            inner = self.alternatives()
            if inner is None or not pattern.startswith(")", self.i):
                return None
            self.i += 1
            text, alternatives = opener, inner
        elif char == "[":
            j = start + 1 + pattern.startswith("^", start + 1)
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            if j >= len(pattern):
                return None
            self.i = j + 1
            text = pattern[start:self.i]
        elif char == "\\":
            nxt = pattern[start + 1:start + 2]
            if not nxt or nxt in _ZERO_WIDTH_ESCAPES or nxt.isdigit() or nxt in "pPk":
                return None
            width = {"u": 6, "x": 4}.get(nxt, 2)
            self.i = start + width
            text = pattern[start:self.i]
        elif char in "*+?{}":
            return None
        else:
            self.i += 1
            text = char
        low, high, end = quantifier(pattern, self.i, len(pattern))
        if low < 0:
            return None
        quantifier_text = pattern[self.i:end]
        self.i = end
        separator = text in ("\\s", " ") or _separator_group(alternatives)
        return _Repeat(text, low, high, quantifier_text, alternatives, separator=separator)


def _separator_group(alternatives: list[list[_Repeat]]) -> bool:
    """A group of one separator atom, once: `( )`."""
    return len(alternatives) == 1 and len(alternatives[0]) == 1 and alternatives[0][0].separator and \
        (alternatives[0][0].low, alternatives[0][0].high) == (1, 1)
