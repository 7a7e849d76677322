"""Drafts from the request's own text (prompt lookup): what followed the last n tokens before.

Extraction copies spans of the prompt into the output (names, dates, amounts); once the output
has started copying, the tokens after the earlier occurrence of its last few tokens are a good
guess of what comes next. A draft costs no model call, only this search; the grammar then cuts
it at the first token it rejects, so verification is never spent on impossible text.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from grammar.backend import GrammarError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grammar.backend import Grammar


def find_ngram_draft(token_ids: Sequence[int], min_ngram: int, max_ngram: int, max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens that followed the most recent earlier occurrence of the last n
    tokens of `token_ids`, trying the longest n first (`max_ngram` down to `min_ngram`).
    [] when no such n-gram occurred before (or `max_tokens` < 1)."""
    if max_tokens < 1:
        return []
    _, begin = find_ngram_match(token_ids, min_ngram, max_ngram)
    return list(token_ids[begin:begin + max_tokens]) if begin >= 0 else []


def find_ngram_match(token_ids: Sequence[int], min_ngram: int, max_ngram: int, anchor: int = 0,
                     anchor_end: int = 0) -> tuple[int, int]:
    """(n, begin): the length of the longest n-gram (`max_ngram` down to `min_ngram`) that ends
    `token_ids` and occurred before, and where the tokens after an earlier occurrence of it begin
    (a longer match is a likelier copy): the first occurrence whose next token lies in
    [`anchor`, `anchor_end`) (the text the output copies from, read in order), else the most
    recent one; (0, -1) when there is none."""
    num_tokens = len(token_ids)
    if num_tokens < min_ngram + 1:
        return 0, -1
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_ngram, num_tokens - 1), min_ngram - 1, -1):
        pattern = tokens[num_tokens - n:]
        num_starts = num_tokens - n  # an occurrence must be followed by at least one token
        match = tokens[:num_starts] == pattern[0]
        for offset in range(1, n):
            match &= tokens[offset:offset + num_starts] == pattern[offset]
        begins = np.flatnonzero(match) + n
        if len(begins):
            ahead = begins[(begins >= anchor) & (begins < anchor_end)]
            return n, int(ahead[0] if len(ahead) else begins[-1])
    return 0, -1


def continued_copy(token_ids: Sequence[int], copy_offset: int, num_check: int) -> int:
    """Where the tokens after `token_ids` are read if it still copies the span it copied before
    (`copy_offset`: how far behind the end that span's next token sat, a negative number, fixed
    while the copy goes on): the index of that next token when the last `num_check` tokens of
    `token_ids` are the ones before it, else -1."""
    num_tokens = len(token_ids)
    begin = num_tokens + copy_offset
    if copy_offset >= 0 or begin < num_check:
        return -1
    for i in range(1, num_check + 1):
        if token_ids[begin - i] != token_ids[num_tokens - i]:
            return -1
    return begin


def cut_by_grammar(grammar: Grammar, draft: list[int], stop_before_forced: bool = False) -> list[int]:
    """The longest prefix of `draft` the grammar accepts from its current state, cut before a
    token that would end the output (nothing could be verified after it) and, with
    `stop_before_forced`, before a token after which the grammar forces text (jump-forward
    appends that text, not the model's tokens). The grammar is left as it was."""
    num_accepted = 0  # tokens the grammar took, to roll back
    num_kept = 0
    try:
        for token_id in draft:
            try:
                accepted = grammar.accept_tokens([token_id])
            except GrammarError:  # its grammar is broken: the request's own next step reports why
                break
            if not accepted:
                break
            num_accepted += 1
            if grammar.is_terminated():
                break
            if stop_before_forced:
                forced = grammar.jump_forward_token_ids()  # accepted by the grammar: undo at once
                if forced:
                    grammar.rollback(len(forced))
                    break
            num_kept = num_accepted
        return draft[:num_kept]
    finally:
        grammar.rollback(num_accepted)
