"""The two lexical readers of patterns (regex_pieces, find_large_repeat) against the parsed form,
over the patterns of test_regex_readers_agree.py: where they agree a rule may move onto the parsed
form unchanged; where they differ, the difference is named here.

- regex_pieces reads `[]` as a class that closes, the parsed form (as Python) reads its "]" as a
  member: they disagree on `[]a]` and `[^]a]` only, patterns the rules built on it leave alone.
- find_large_repeat also reads a count with spaces (`a{ 5 }`), which ECMA-262 reads as text, and
  it reads patterns the parsed form refuses (an inline flag, a lookaround): it guards backends whose
  own parsers read more than ECMA-262 (llguidance's reads both), so it stays lexical.
"""
from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator

import pytest

from grammar.regex.parsed import Atom, parse_regex
from grammar.regex.pieces import regex_pieces
from grammar.regex.repeat_counts import find_large_repeat

PINNED = sorted(json.loads((pathlib.Path(__file__).parent / "regex_readers_pinned.json").read_text()))
READ = [p for p in PINNED if parse_regex(p) is not None]
EMPTY_CLASS_FIRST = {"[]a]", "[^]a]"}  # regex_pieces: "[]" then the text "a]"
SPACED_COUNTS = {"a{ 2}"}  # find_large_repeat: a count; ECMA-262: the text "{ 2}"
_BRACED = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def _atoms_at(alternatives: list[list[Atom]], offset: int) -> Iterator[tuple[int, Atom]]:
    """(offset in the pattern, atom) for every atom, nested ones too: the atoms are the pattern's text."""
    for k, sequence in enumerate(alternatives):
        offset += k > 0  # the "|"
        for atom in sequence:
            yield offset, atom
            if atom.alternatives:
                yield from _atoms_at(atom.alternatives, offset + len(atom.text))
            offset += len(atom.render())


def _class_positions_parsed(pattern: str) -> set[int]:
    """Offsets inside a class, regex_pieces' way: the "[" counts as inside, the closing "]" not."""
    out: set[int] = set()
    for offset, atom in _atoms_at(parse_regex(pattern) or [], 0):
        if atom.text.startswith("[") and not atom.alternatives:
            out.update(range(offset, offset + len(atom.text) - 1))
    return out


def _class_positions_pieces(pattern: str) -> set[int]:
    return {i + k for i, piece, in_class in regex_pieces(pattern) if in_class for k in range(len(piece))}


def _large_repeat_parsed(pattern: str, max_count: int) -> tuple[str, int] | None:
    """find_large_repeat's answer read from the parsed form's quantifiers."""
    found = []
    for offset, atom in _atoms_at(parse_regex(pattern) or [], 0):
        if braced := _BRACED.fullmatch(atom.quantifier_text.removesuffix("?")):
            for count in braced.groups():
                digits = (count or "").lstrip("0")
                if digits and (len(digits) > len(str(max_count)) or int(digits) > max_count):
                    at = offset + len(atom.render()) - len(atom.quantifier_text)
                    found.append((at, digits if len(digits) <= 24 else digits[:24] + "..."))
                    break
    return (min(found)[1], min(found)[0]) if found else None


def test_the_pinned_patterns_are_mostly_read():
    assert len(READ) > 280
    assert EMPTY_CLASS_FIRST | SPACED_COUNTS <= set(READ)


@pytest.mark.parametrize("pattern", READ)
def test_regex_pieces_reads_the_classes_the_parsed_form_reads(pattern):
    agree = _class_positions_pieces(pattern) == _class_positions_parsed(pattern)
    assert agree == (pattern not in EMPTY_CLASS_FIRST)


@pytest.mark.parametrize("max_count", [0, 1, 3, 100_000])
def test_find_large_repeat_finds_the_parsed_form_s_counts(max_count):
    differ = [p for p in READ if find_large_repeat(p, max_count) != _large_repeat_parsed(p, max_count)]
    assert set(differ) == (SPACED_COUNTS if max_count < 2 else set())


@pytest.mark.parametrize("pattern, found", [
    ("a{ 999999999 }", ("999999999", 1)),
    ("(?i)a{999999999}", ("999999999", 5)),
    ("(?=a)a{999999999}", ("999999999", 6)),
])
def test_find_large_repeat_also_guards_what_the_parsed_form_refuses_or_reads_as_text(pattern, found):
    assert _large_repeat_parsed(pattern, 100_000) is None
    assert find_large_repeat(pattern, 100_000) == found
