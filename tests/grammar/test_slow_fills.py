"""Which slow bitmask fills a request may have (grammar/runtime/slow_fills.py)."""
from __future__ import annotations

import pytest

from grammar.config import GrammarConfig
from grammar.runtime.slow_fills import SlowFills

CONFIG = GrammarConfig(max_fill_ms=100.0, lazy_fill_budget_ms=500.0)


def test_an_eager_grammar_may_have_no_fill_over_max_fill_ms():
    fills = SlowFills(CONFIG, lazy_masks=False)
    assert fills.allows(99.0) and fills.allows(100.0)
    assert not fills.allows(100.5)
    assert fills.limit_text() == "this server's max_fill_ms limit of 100"


def test_a_lazy_grammar_may_spend_its_budget_in_slow_fills_and_no_more():
    fills = SlowFills(CONFIG, lazy_masks=True)
    assert fills.allows(300.0)  # a state's first fill, building its mask
    assert fills.allows(50.0) and fills.spent_ms == 300.0  # fast fills are not counted
    assert fills.allows(200.0)  # 500 of 500
    assert not fills.allows(101.0)  # 601: past the budget
    assert "lazy_fill_budget_ms of 500" in fills.limit_text() and "601 ms so far" in fills.limit_text()


@pytest.mark.parametrize("value", [0, -1.0])
def test_the_budget_must_be_positive(value):
    with pytest.raises(ValueError, match="lazy_fill_budget_ms must be > 0"):
        GrammarConfig(lazy_fill_budget_ms=value)
