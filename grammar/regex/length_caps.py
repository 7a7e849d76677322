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

from grammar.regex.parsed import ZERO_WIDTH_ESCAPES, Atom, lengths, parse_regex, render, walk

MAX_REPEATS = 200  # atoms in one pattern, past which it is not read


def cap_lengths(pattern: str, min_length: int, max_length: int | None) -> tuple[str, bool] | None:
    """(`pattern` narrowed so that every match has a length within the bounds, whether that is
    narrower than pattern + bounds) (see the module docstring), or None where it cannot be read
    or no match can have an allowed length. Exact when one alternative is left with one repeat
    of a variable count, of a fixed-width body, inside no other repeat: its counts then say
    exactly which lengths the bounds allow."""
    if "[]" in pattern or "[^]" in pattern:
        return None
    parsed = parse_regex(pattern)
    if parsed is None or not all(_starts_anchored(b) and _ends_anchored(b) for b in parsed):
        return None
    atoms = [a for b in parsed for a in walk(b)]
    if len(atoms) > MAX_REPEATS or any(_not_modelled(a) for a in atoms):
        return None
    anchors = {id(r) for r in atoms if r.anchor}
    if anchors != set().union(*(_edge_anchors(b, True, True) for b in parsed)):
        return None  # an anchor inside: not modelled
    # alternatives no match of which has an allowed length are dropped (exact)
    parsed = [b for b in parsed if (max_length is None or lengths(b)[0] <= max_length)
              and (lengths(b)[1] is None or lengths(b)[1] >= min_length)]  # type: ignore[operator]
    if not parsed:
        return None
    repeats = [r for b in parsed for r in walk(b)]
    variable = [r for r in repeats if not r.anchor and r.low != r.high]
    exact = len(parsed) == 1 and (not variable or len(variable) == 1 and _body_width(variable[0]) is not None
                                  and any(r is variable[0] for r in walk(parsed[0], outside_repeats=True)))
    if max_length is not None:
        for repeat in repeats:
            if repeat.written[1] is None and _is_separator(repeat) and not exact:
                repeat.high = max(repeat.low, 1)
        if _cap(parsed, repeats, max_length) is None:
            return None
    kept = []
    for branch in parsed:
        low, high = lengths(branch)
        if (max_length is not None and low > max_length) or (high is not None and high < min_length):
            continue  # no match of this alternative has an allowed length
        if low < min_length and not _raise_minimum(branch, min_length - low):
            return None
        kept.append(branch)
    return ("|".join(render(b) for b in kept), not exact) if kept else None


def _cap(parsed: list[list[Atom]], repeats: list[Atom], max_length: int) -> int | None:
    """Sets the largest cap K under which the longest match fits max_length; None if none does."""
    open_repeats = [r for r in repeats if r.written[1] is None and r.high is None]

    def longest(cap: int) -> int | None:
        for repeat in open_repeats:
            repeat.high = max(repeat.low, cap)
        return max(lengths(b)[1] for b in parsed)  # type: ignore[type-var]

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


def _raise_minimum(branch: list[Atom], deficit: int) -> bool:
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


def _body_width(repeat: Atom) -> int | None:
    if not repeat.alternatives:
        return 0 if repeat.anchor else 1
    inner = [lengths(a) for a in repeat.alternatives]
    widths = {low for low, high in inner if low == high}
    return widths.pop() if len(widths) == 1 and all(low == high for low, high in inner) else None


def _edge_anchors(sequence: list[Atom], at_start: bool, at_end: bool) -> set[int]:
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


def _starts_anchored(sequence: list[Atom]) -> bool:
    if not sequence:
        return False
    first = sequence[0]
    if first.anchor:
        return first.text == "^"
    return bool(first.alternatives) and (first.low, first.high) == (1, 1) and all(
        _starts_anchored(a) for a in first.alternatives)


def _ends_anchored(sequence: list[Atom]) -> bool:
    if not sequence:
        return False
    last = sequence[-1]
    if last.anchor:
        return last.text == "$"
    return bool(last.alternatives) and (last.low, last.high) == (1, 1) and all(
        _ends_anchored(a) for a in last.alternatives)


def _not_modelled(atom: Atom) -> bool:
    """An escape these lengths misread: a position, a back-reference, a property or named class."""
    letter = atom.escape
    return bool(letter) and (letter in ZERO_WIDTH_ESCAPES or letter.isdigit() or letter in "pPk")


def _is_separator(atom: Atom) -> bool:
    """Whitespace (`\\s`, a space), or a group of one such atom, once: `( )`."""
    if atom.text in ("\\s", " "):
        return True
    alternatives = atom.alternatives
    return len(alternatives) == 1 and len(alternatives[0]) == 1 and _is_separator(alternatives[0][0]) and \
        alternatives[0][0].written == (1, 1)
