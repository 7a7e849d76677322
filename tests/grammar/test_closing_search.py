"""The closing search's budget (grammar/runtime/closing_search.py) on a library-free cursor whose states
are built on first use, as a lazily compiled grammar's are; and when a failed search is retried
(grammar/runtime/early_closing.py)."""
from __future__ import annotations

import time

from grammar_fakes import AnyTokenGrammar

from grammar.config import GrammarConfig
from grammar.runtime import closing_search
from grammar.runtime.closing_search import find_closing
from grammar.runtime.early_closing import EarlyClosing
from grammar.runtime.slow_fills import SlowFills

CLOSING = '","a":"","b":"","c":"","d":""}'  # 30 characters, one state each
FIRST_FILL_COST_S = 0.003


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class LazyCursor:
    """Accepts exactly CLOSING; the first allowed_chars() at each point burns FIRST_FILL_COST_S of CPU
    (building that state's mask), later ones are free."""

    def __init__(self) -> None:
        self.text = ""
        self.pushes: list[str] = []
        self.built: set[int] = set()  # the points whose mask is built

    def allowed_chars(self) -> str:
        at = len(self.text)
        if at not in self.built:
            self.built.add(at)
            _burn(FIRST_FILL_COST_S)
        return CLOSING[at] if at < len(CLOSING) else ""

    def push(self, text: str) -> bool:
        if not CLOSING.startswith(self.text + text):
            return False
        self.pushes.append(text)
        self.text += text
        return True

    def pop(self, num_steps: int) -> None:
        for _ in range(num_steps):
            self.text = self.text[:-len(self.pushes.pop())]

    def forced_text(self) -> str:
        return ""

    def is_complete(self) -> bool:
        return self.text == CLOSING


def _budget(budget_ms: float) -> SlowFills:
    return SlowFills(GrammarConfig(lazy_fill_budget_ms=budget_ms), lazy_masks=True)


def test_first_fills_cut_a_search_that_has_no_budget_for_them():
    cursor = LazyCursor()  # 30 first fills of 3 ms: past the search's own 20 ms
    assert find_closing(cursor, 64, max_cpu_s=0.02) is None
    assert cursor.text == ""  # the cursor is left as it was


def test_a_first_fill_budget_pays_for_them_and_the_closing_is_found():
    cursor, budget = LazyCursor(), _budget(2000.0)
    assert find_closing(cursor, 64, max_cpu_s=0.02, first_fills=budget) == CLOSING
    assert cursor.text == ""
    assert budget.spent_ms >= len(CLOSING) * FIRST_FILL_COST_S * 1000  # every first fill counted there


def test_the_first_fill_budget_is_a_bound_too():
    budget = _budget(30.0)  # ten first fills' worth, then the search's own 20 ms
    assert find_closing(LazyCursor(), 64, max_cpu_s=0.02, first_fills=budget) is None
    assert budget.spent_ms > 30.0


def test_an_eagerly_compiled_grammar_gets_no_first_fill_budget():
    eager = SlowFills(GrammarConfig(), lazy_masks=False)
    assert not eager.spend(2.0)
    assert find_closing(LazyCursor(), 64, max_cpu_s=0.02, first_fills=eager) is None


def test_once_its_states_are_built_the_plain_budget_finds_the_closing():
    cursor = LazyCursor()
    assert find_closing(cursor, 64, max_cpu_s=0.02, first_fills=_budget(2000.0)) == CLOSING
    assert find_closing(cursor, 64, max_cpu_s=0.02) == CLOSING


class FlakyGrammar(AnyTokenGrammar):
    """A closing of `num_tokens` tokens that the first `num_failures` searches do not find."""

    def __init__(self, num_tokens: int, num_failures: int) -> None:
        super().__init__()
        self.num_tokens = num_tokens
        self.num_failures = num_failures
        self.searched_at: list[int] = []

    def closing_token_ids(self, max_tokens, first_fills=None):
        self.searched_at.append(max_tokens)
        if len(self.searched_at) <= self.num_failures or max_tokens < self.num_tokens:
            return None
        return [7] * self.num_tokens


def _close_down_from(closing: EarlyClosing, num_budget_tokens: int) -> tuple[list[int], str, int] | None:
    """Step the budget down one token at a time: (the closing, why, the budget left) once it closes."""
    for num_remaining in range(num_budget_tokens, 0, -1):
        found = closing.check([1], num_remaining)
        if found is not None:
            return found[0], found[1], num_remaining
    return None


def test_a_failed_search_is_retried_while_the_longest_closing_seen_still_fits():
    grammar = FlakyGrammar(num_tokens=100, num_failures=2)
    closing = EarlyClosing(grammar)
    closing.check_minimum(200, min_output_tokens=100)
    found = _close_down_from(closing, 200)
    assert found is not None and found[1] == "budget" and len(found[0]) == 100 and found[2] >= 100
    # both misses were retried before the budget fell to the closing (halving the budget left
    # would have searched at 200, 100 and 50)
    assert grammar.searched_at[2] > 103 and grammar.searched_at[1] > grammar.searched_at[2]


def test_one_search_waits_for_first_fills_only_so_long(monkeypatch):
    monkeypatch.setattr(closing_search, "MAX_FIRST_FILLS_S", 0.03)  # ten first fills
    budget = _budget(2000.0)
    cursor = LazyCursor()
    assert find_closing(cursor, 64, max_cpu_s=0.02, first_fills=budget) is None
    assert budget.spent_ms < 60.0  # the request's budget is kept for the next search
    built = len(cursor.built)
    assert 0 < built < len(CLOSING)
    # the next searches go on from the states built before (each one ~16 of the 30 here, so
    # searches that started over would never get there)
    for _ in range(4):
        found = find_closing(cursor, 64, max_cpu_s=0.02, first_fills=budget)
        if found is not None:
            break
        assert len(cursor.built) > built
        built = len(cursor.built)
    assert found == CLOSING


def test_a_lazily_compiled_grammar_searches_a_few_times_in_the_last_stretch_not_every_step():
    eager, lazy = FlakyGrammar(num_tokens=100, num_failures=0), FlakyGrammar(num_tokens=100, num_failures=0)
    for grammar, first_fills in ((eager, None), (lazy, _budget(2000.0))):
        closing = EarlyClosing(grammar, first_fills=first_fills)
        closing.check_minimum(200, min_output_tokens=100)
        found = _close_down_from(closing, 200)
        assert found is not None and found[1] == "budget" and found[2] >= 100
    assert len(eager.searched_at) > 90  # every step within twice the closing of the end
    assert len(lazy.searched_at) < 12  # each search pays first fills: the lead halves instead


class OnceFoundGrammar(AnyTokenGrammar):
    """Its first search finds a closing of `num_tokens`, later ones nothing (out of time), while
    that closing keeps completing the output."""

    def __init__(self, num_tokens: int) -> None:
        super().__init__()
        self.num_tokens = num_tokens
        self.searched_at: list[int] = []
        self.strict_checks = 0

    def closing_token_ids(self, max_tokens, first_fills=None):
        self.searched_at.append(max_tokens)
        return [7] * self.num_tokens if len(self.searched_at) == 1 else None

    def completes(self, token_ids, strict=False):
        self.strict_checks += strict
        return token_ids == [7] * self.num_tokens


def test_a_closing_that_still_completes_the_output_is_kept_when_the_last_search_misses():
    grammar = OnceFoundGrammar(num_tokens=10)
    closing = EarlyClosing(grammar)
    closing.check_minimum(200)
    found = _close_down_from(closing, 200)
    # no search until it is time to close (the first closing holds), then one that finds nothing:
    # the first closing, checked in full, is appended
    assert found == ([7] * 10, "budget", 13)
    assert grammar.searched_at == [4096, 13] and grammar.strict_checks == 1
