"""A short text that completes an output from where its grammar stands.

The search runs over a small ASCII alphabet, depth first, against the request's own matcher:
each candidate character is pushed (accepted as one step), explored, and popped (rolled back), so
the matcher ends where it started. Text the grammar forces at a point (a property name, the rest
of `true`) is pushed whole, as one step. Candidates are tried closers first — the quote that ends a
string, the brace or bracket that ends a container — then the shortest values (`0`, `""`, `[]`),
so the first completion found is short: it closes the string, supplies what is required with
minimal values, and closes the containers. It is not always the shortest possible one. Where a
character leads back to the same point (a string's content, a pattern's `\\w+`), the ways out of
that loop are tried before going round it again. A way out that is a particular word (`\\w+\\.dll`
needs `.dll`; a think section needs its end marker) cannot be found a character at a time: the
caller passes such words as `hints` (grammar/regex/suffixes.py finds them in a pattern), and they
are tried first where the search starts and one step after it, wherever it enters a loop and just
after it leaves one (`([a-z]+ )+the end\\.` after a space) — each one kept only if the matcher accepts it there and it
leads somewhere new.

A grammar whose token masks are built on first use pays for each state's first fill (a few ms
to a second) the first time the search, or the request, reaches it; later fills of the state take
microseconds. Such fills are not the search's own work: given a `FirstFillBudget`, the search
counts a call over FIRST_FILL_S against that budget instead of its CPU limit, while the budget
lasts (and up to MAX_FIRST_FILLS_S in one search), so a closing through states nobody has
reached yet is still found.

Library-free: the matcher sits behind `TextCursor`.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grammar.backend import FirstFillBudget

# in free text (a string's content, where `a` is allowed) the quote comes first and fill is `a`;
# elsewhere the containers close first, then the shortest values and separators
_FREE_TEXT_ORDER = '"a}],0 1-.:'
_STRUCTURE_ORDER = '}]",01-.:{[tfn'
_CLOSERS = '"}]'  # what ends a string or a container
# a cursor call this slow builds a lazily compiled state's mask (a warm fill takes ~10-50 µs)
FIRST_FILL_S = 0.001
# one search waits at most this long for first fills (the step, everyone's, waits with it); the
# states it built stay built, so the next search goes further
MAX_FIRST_FILLS_S = 0.5
# the rest of printable ASCII, for patterns and grammars that need other characters
_TAIL = ("2345678bcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ9_@+/#$%&'()*;<=>?!^`|~\\"
         "\n\t")
ALPHABET = "".join(dict.fromkeys(_FREE_TEXT_ORDER + _STRUCTURE_ORDER + _TAIL))


class TextCursor(Protocol):
    """A matcher seen as text: push and pop steps, ask what may come next."""

    def allowed_chars(self) -> str:
        """The characters of ALPHABET the grammar accepts next (any order). Changes nothing."""

    def push(self, text: str) -> bool:
        """Accept `text` as one step; False, with nothing changed, if the grammar rejects it."""

    def pop(self, num_steps: int) -> None:
        """Undo the last `num_steps` pushes."""

    def forced_text(self) -> str:
        """Text the grammar forces next ('' if none, or if the cursor cannot tell)."""

    def is_complete(self) -> bool:
        """The text so far is a complete output (the grammar may or may not allow more)."""


class _Clock:
    """The search's CPU limit, less the first fills that `first_fills` pays for."""

    __slots__ = ("deadline", "first_fills", "excused_s")

    def __init__(self, max_cpu_s: float, first_fills: FirstFillBudget | None) -> None:
        self.deadline = time.thread_time() + max_cpu_s
        self.first_fills = first_fills
        self.excused_s = 0.0

    def expired(self) -> bool:
        return time.thread_time() > self.deadline

    def excuse(self, elapsed_s: float) -> None:
        """A cursor call took `elapsed_s`: if it was a first fill the budget pays for, move the
        deadline by as much."""
        if (elapsed_s > FIRST_FILL_S and self.first_fills is not None and self.excused_s < MAX_FIRST_FILLS_S
                and self.first_fills.spend(elapsed_s * 1000)):
            self.deadline += elapsed_s
            self.excused_s += elapsed_s


class _TimedCursor:
    """`cursor` with its mask-building calls (allowed_chars, forced_text) timed by `clock`."""

    __slots__ = ("_cursor", "_clock", "push", "pop", "is_complete")

    def __init__(self, cursor: TextCursor, clock: _Clock) -> None:
        self._cursor = cursor
        self._clock = clock
        self.push = cursor.push
        self.pop = cursor.pop
        self.is_complete = cursor.is_complete

    def allowed_chars(self) -> str:
        start = time.thread_time()
        allowed = self._cursor.allowed_chars()
        self._clock.excuse(time.thread_time() - start)
        return allowed

    def forced_text(self) -> str:
        start = time.thread_time()
        forced = self._cursor.forced_text()
        self._clock.excuse(time.thread_time() - start)
        return forced


def _ordered(allowed: str) -> list[str]:
    order = _FREE_TEXT_ORDER if "a" in allowed else _STRUCTURE_ORDER
    head = [c for c in dict.fromkeys(order) if c in allowed]
    return head + [c for c in ALPHABET if c in allowed and c not in head]


class _Node:
    __slots__ = ("candidates", "index", "num_steps", "allowed", "loop", "loop_run")

    def __init__(self, candidates: list[str], num_steps: int, allowed: str = "",
                 loop: list[str] | None = None, loop_run: int = 0) -> None:
        self.candidates = candidates
        self.index = 0
        self.num_steps = num_steps  # pushes made to reach this node from its parent
        self.allowed = allowed  # what the grammar accepted here
        self.loop = loop  # in a loop: the candidates, exits first (see _loop_candidates)
        self.loop_run = loop_run  # steps the loop has gone round so far


def _leaves(cursor: TextCursor, text: str, allowed: str) -> bool:
    """Pushing `text` here completes the output or leads to other characters than `allowed`
    (False if the grammar rejects it). The cursor is left as it was."""
    if not cursor.push(text):
        return False
    leaves = cursor.is_complete() or cursor.allowed_chars() != allowed
    cursor.pop(1)
    return leaves


def _fitting_hints(cursor: TextCursor, allowed: str, hints: Sequence[str], max_chars: int) -> list[str]:
    """The hints (at most `max_chars` long) that lead out of this point (see _leaves)."""
    return [hint for hint in hints if len(hint) <= max_chars
            and (hint[0] not in ALPHABET or hint[0] in allowed) and _leaves(cursor, hint, allowed)]


def _start_candidates(cursor: TextCursor, allowed: str, hints: list[str]) -> list[str]:
    """Where the search starts: the closers that lead out (the quote that ends a string), then the
    fitting `hints`, then the rest. A closer that is only text here (a quote inside a think
    section) comes after the hints."""
    ordered = _ordered(allowed)
    if not hints:
        return ordered
    num_closers = next((i for i, c in enumerate(ordered) if c not in _CLOSERS), len(ordered))
    closers = [c for c in ordered[:num_closers] if _leaves(cursor, c, allowed)]
    return closers + hints + [c for c in ordered if c not in closers]


def _loop_candidates(cursor: TextCursor, allowed: str, hints: list[str]) -> list[str]:
    """At a point the last character led back to (the same characters allowed as before it): the
    candidates that leave the loop (the fitting `hints` among them), then one character that goes
    round it again (the others that do are equivalent), and an escape (`\\`, which inside a string
    mostly returns to it) last.

    A pattern such as `\\w+[\\\\]\\w+` needs this: `a` is allowed forever, the way out is a
    backslash. One look ahead per candidate, once per loop."""
    exits, round_trip, escape = [], [], []
    for char in _ordered(allowed):
        if not cursor.push(char):
            continue
        after = cursor.allowed_chars()
        cursor.pop(1)
        if after == allowed:
            round_trip = round_trip or [char]
        elif char == "\\":
            escape = [char]
        else:
            exits.append(char)
    # a closer first (the quote that ends a string is shorter than any word), then the hints,
    # then the other exits (a `.` that only leads on to more letters)
    num_closers = next((i for i, c in enumerate(exits) if c not in _CLOSERS), len(exits))
    return exits[:num_closers] + hints + exits[num_closers:] + round_trip + escape


def find_closing(cursor: TextCursor, max_chars: int, max_nodes: int = 1000, max_cpu_s: float = 0.02,
                 hints: Sequence[str] = (), first_fills: FirstFillBudget | None = None) -> str | None:
    """Text that makes the output complete, at most `max_chars` long, or None if the search
    finds none within `max_nodes` visited points and `max_cpu_s` of this thread's CPU time (a
    grammar whose bitmask fill is slow gets few points). The cursor is left as it was.
    `hints`: words that may lead out of a loop, shortest first (see the module doc).
    `first_fills`: pays for the cursor calls over FIRST_FILL_S, which then do not count against
    `max_cpu_s` (None: every call counts).

    A loop (a character that leads back to where it started) goes round at most 32 times in a
    first pass, so that a way out of it is tried early (unless nothing but an escape leads out of
    it: a minLength string); a second pass lifts that.
    Cost: one allowed_chars() per visited point plus a push and a pop per tried candidate; a
    JSON closing typically visits a few points per character it writes.
    """
    clock = _Clock(max_cpu_s, first_fills)
    timed = _TimedCursor(cursor, clock) if first_fills is not None else cursor
    for max_loop_run in (32, max_chars):
        found, num_visited = _search(timed, max_chars, max_nodes, clock, max_loop_run, hints)
        if found is not None or num_visited > max_nodes:
            return found
        max_nodes -= num_visited
    return None


def _search(cursor: TextCursor, max_chars: int, max_nodes: int, clock: _Clock,
            max_loop_run: int, hints: Sequence[str]) -> tuple[str | None, int]:
    texts: list[str] = []  # the text of each push on the current path, in order
    nodes: list[_Node] = []
    length = num_visited = 0

    def enter(num_steps: int, pushed: str) -> bool:
        """Take the forced text at this point, then open it; True if the output is complete."""
        nonlocal length, num_visited
        forced = cursor.forced_text()
        if forced and length + len(forced) <= max_chars and cursor.push(forced):
            texts.append(forced)
            length += len(forced)
            num_steps += 1
        if cursor.is_complete():
            nodes.append(_Node([], num_steps))
            return True
        num_visited += 1
        if clock.expired():
            num_visited = max_nodes + 1  # out of time: unwind
        if length >= max_chars or num_visited > max_nodes:
            nodes.append(_Node([], num_steps))
            return False
        allowed = cursor.allowed_chars()
        parent = nodes[-1] if nodes else None
        if parent is not None and not forced and len(pushed) == 1 and parent.allowed == allowed:
            loop = parent.loop if parent.loop is not None else _loop_candidates(
                cursor, allowed, _fitting_hints(cursor, allowed, hints, max_chars - length))
            run = parent.loop_run + 1
            # past the cap, stop going round — unless only an escape leads out (a minLength string)
            leaving = [c for c in loop if c != pushed]
            candidates = loop if run < max_loop_run or leaving in ([], ["\\"]) else leaving
            nodes.append(_Node(candidates, num_steps, allowed, loop, run))
        elif parent is None or parent.loop is not None or len(nodes) == 1:  # the start, or a step from it or a loop
            fitting = _fitting_hints(cursor, allowed, hints, max_chars - length)
            nodes.append(_Node(_start_candidates(cursor, allowed, fitting), num_steps, allowed))
        else:
            nodes.append(_Node(_ordered(allowed), num_steps, allowed))
        return False

    try:
        if enter(0, ""):
            return "".join(texts), num_visited
        while nodes:
            node = nodes[-1]
            if node.index < len(node.candidates) and num_visited <= max_nodes:
                char = node.candidates[node.index]
                node.index += 1
                if not cursor.push(char):
                    continue
                texts.append(char)
                length += len(char)
                if enter(1, char):
                    return "".join(texts), num_visited
                continue
            nodes.pop()
            if node.num_steps:
                cursor.pop(node.num_steps)
                for _ in range(node.num_steps):
                    length -= len(texts.pop())
        return None, num_visited
    finally:
        num_pushed = sum(node.num_steps for node in nodes)
        if num_pushed:
            cursor.pop(num_pushed)
