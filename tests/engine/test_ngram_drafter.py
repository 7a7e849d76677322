"""Prompt-lookup drafts: the longest n-gram first, its latest earlier occurrence, and the grammar's cut."""
from __future__ import annotations

import numpy as np
from grammar_fakes import ScriptedGrammar

from engine.spec_decode.ngram_drafter import continued_copy, cut_by_grammar, find_ngram_draft, find_ngram_match
from engine.worker.draft_verification import draft_logits_indices, num_accepted


def test_draft_is_what_followed_the_last_tokens_before():
    #           0   1   2   3   4   5   6   7   8
    tokens = [10, 11, 12, 13, 14, 20, 21, 10, 11]
    assert find_ngram_draft(tokens, 1, 3, 3) == [12, 13, 14]  # "10 11" at 0 -> what followed it


def test_longest_ngram_wins_over_a_later_shorter_match():
    # "5 6 7" occurred at 0 (followed by 1, 2); "7" alone occurred later, at 6 (followed by 9)
    tokens = [5, 6, 7, 1, 2, 3, 7, 9, 5, 6, 7]
    assert find_ngram_draft(tokens, 1, 3, 2) == [1, 2]
    assert find_ngram_draft(tokens, 1, 1, 2) == [9, 5]  # n = 1 only: the latest "7" before the end


def test_latest_occurrence_of_the_same_ngram_is_used():
    tokens = [4, 1, 4, 2, 4]
    assert find_ngram_draft(tokens, 1, 1, 1) == [2]


def test_no_draft_without_an_earlier_occurrence_or_room():
    assert find_ngram_draft([1, 2, 3, 4], 1, 3, 4) == []
    assert find_ngram_draft([1, 2, 1], 1, 3, 0) == []
    assert find_ngram_draft([7], 1, 3, 4) == []
    assert find_ngram_draft([3, 3, 1, 2], 2, 3, 4) == []  # "1 2" / "3 1 2" never occurred before


def test_draft_stops_at_the_end_of_the_text():
    assert find_ngram_draft([8, 9, 8], 1, 2, 5) == [9, 8]


def test_grammar_cuts_the_draft_at_the_first_rejected_token_and_is_left_as_it_was():
    grammar = ScriptedGrammar(forbidden={30})
    grammar.accept_tokens([1, 2])
    assert cut_by_grammar(grammar, [5, 6, 30, 7]) == [5, 6]
    assert grammar.accepted == [1, 2]
    assert cut_by_grammar(grammar, [30, 5]) == []
    assert cut_by_grammar(grammar, [5, 6, 7]) == [5, 6, 7]
    assert grammar.accepted == [1, 2]


def test_draft_ends_before_a_token_that_ends_the_output():
    grammar = ScriptedGrammar(terminal={99})
    assert cut_by_grammar(grammar, [5, 99, 6]) == [5]
    assert grammar.accepted == []


def test_draft_ends_before_a_token_after_which_text_is_forced_when_jump_forward_is_on():
    grammar = ScriptedGrammar(forcing={40: [41, 42]})
    assert cut_by_grammar(grammar, [5, 40, 41, 42, 6], stop_before_forced=True) == [5]
    assert grammar.accepted == []
    assert cut_by_grammar(grammar, [5, 40, 41, 42, 6]) == [5, 40, 41, 42, 6]  # jump-forward off
    assert grammar.accepted == []


def test_logits_indices_cover_each_draft_and_the_token_before_it():
    # three requests: last scheduled tokens at 0, 5 and 9; drafts of 0, 3 and 1 tokens
    indices = draft_logits_indices(np.array([0, 5, 9]), np.array([0, 3, 1]))
    assert indices.tolist() == [0, 2, 3, 4, 5, 8, 9]


def test_greedy_acceptance_is_the_agreeing_prefix():
    assert num_accepted([5, 6, 7], [5, 6, 7, 8]) == 3
    assert num_accepted([5, 6, 7], [5, 9, 7, 8]) == 1
    assert num_accepted([5, 6, 7], [4, 6, 7, 8]) == 0


def test_a_copy_goes_on_where_it_was_read_while_its_last_tokens_agree():
    #           0   1   2   3   4   5   6   7   8
    tokens = [10, 11, 12, 13, 5, 12, 9, 11, 12]
    # the last draft was read at index 1 when the text had 7 tokens: offset -6, so now at index 3
    assert continued_copy(tokens, -6, 1) == 3
    assert continued_copy(tokens, -6, 2) == 3  # "11 12" before index 3 too
    assert continued_copy(tokens + [9], -7, 1) == -1  # the text went its own way: no copy to go on with
    assert continued_copy(tokens, 0, 1) == -1  # no copy yet
    assert continued_copy(tokens, -9, 1) == -1  # before the start


def test_a_match_is_read_from_the_prompt_after_where_the_output_last_copied():
    #           0  1   2  3  4   5  6 | 7 (output)
    tokens = [5, 7, 20, 9, 7, 21, 4, 7]
    assert find_ngram_match(tokens, 1, 1) == (1, 5)  # the latest "7": followed by 21
    assert find_ngram_match(tokens, 1, 1, anchor=1, anchor_end=7) == (1, 2)  # the first "7" at or after 1
    assert find_ngram_match(tokens, 1, 1, anchor=3, anchor_end=7) == (1, 5)
    assert find_ngram_match(tokens, 1, 1, anchor=6, anchor_end=7) == (1, 5)  # none ahead: the latest
