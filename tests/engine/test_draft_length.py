"""How long a draft is: the measured cost of a step's rows against the tokens a draft is expected
to give (engine/spec_decode/step_cost.py, engine/spec_decode/acceptance_rate.py, engine/spec_decode/speculator.py).
Pure: hand-fed step times, no model."""
from __future__ import annotations

import pytest
from conftest import make_request

from engine.config import SpeculativeConfig
from engine.spec_decode.acceptance_rate import AcceptanceRate
from engine.spec_decode.speculator import Speculator
from engine.spec_decode.step_cost import StepCostModel

# the prompt holds a span the output copies: after "10", "11 12 ... 19" is the draft
PROMPT = [3, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 5, 6, 10]
# bound by reading the weights up to 16 rows (about the same time), then every row costs 2.4 ms
WEIGHTS_BOUND = {1: 0.020, 8: 0.021, 16: 0.022, 32: 0.060}


def speculator(step_seconds: dict[int, float], k: int = 8, **config) -> Speculator:
    speculator = Speculator(SpeculativeConfig(enabled=True, num_speculative_tokens=k, min_ngram=1, **config))
    for num_tokens, seconds in step_seconds.items():
        speculator.observe_step(num_tokens, seconds)
    return speculator


def test_step_cost_reads_between_beyond_and_below_what_was_measured():
    cost = StepCostModel(prior_per_token_s=0.001)
    assert not cost.measured and cost.seconds(5) == 0.0
    cost.observe(64, 0.040)
    assert cost.seconds(1) == 0.040 and cost.seconds(96) == pytest.approx(0.040 + 0.001 * 32)  # the prior slope
    cost.observe(1, 0.010)
    cost.observe(7, 0.012)  # bucket 8
    assert cost.seconds(1) == 0.010 and cost.seconds(8) == 0.012
    assert cost.seconds(4) == pytest.approx(0.010 + 0.002 * 3 / 7)
    assert cost.seconds(128) == pytest.approx(0.040 + (0.040 - 0.012) / 56 * 64)  # the last slope measured
    cost.observe(16, 0.009)  # noise: never cheaper than a smaller step
    assert cost.seconds(16) == 0.012
    cost.observe(1, 0.020)  # a moving average, not the last step alone
    assert 0.010 < cost.seconds(1) < 0.020


def test_acceptance_rate_follows_recent_drafts_and_fades_back_to_the_prior():
    rate = AcceptanceRate()
    assert rate.rate(0.3) == pytest.approx(0.3)
    rate.add(4, 4)
    high = rate.rate(0.3)
    rate.add(4, 0)
    assert high > rate.rate(0.3) > 0.3
    for _ in range(4):
        rate.add(6, 0)
    assert rate.rate(0.3) < 0.3
    for _ in range(40):  # steps without a draft
        rate.add(0, 0)
    assert rate.rate(0.3) == pytest.approx(0.3, abs=0.01)


def test_nearly_free_rows_draft_long_and_rows_that_cost_their_share_draft_nothing():
    spec = speculator(WEIGHTS_BOUND)
    spec.begin_step(1)
    assert spec.draft_length(0.9, 8) == 8
    assert spec.draft_length(0.05, 8) == 1  # unlikely tokens: only the first is worth its row
    spec.begin_step(64)
    assert spec.draft_length(0.9, 8) == 0


def test_first_steps_draft_in_full_to_measure():
    spec = speculator({})
    spec.begin_step(4)
    assert spec.draft_length(0.1, 8) == 8


def test_rows_planned_for_other_requests_count():
    spec = speculator(WEIGHTS_BOUND)
    earlier = make_request(token_ids=PROMPT)
    spec.draft_state(earlier).draft_ngram = 1
    for _ in range(5):
        spec.record(earlier, 8, 8)  # drafts after a 1-gram match were taken whole: a high prior for them
    spec.begin_step(8)
    first, second = make_request(token_ids=PROMPT), make_request(token_ids=PROMPT)
    assert spec.propose(first, 8, 8, stop_at_forced=False) == [11, 12, 13, 14, 15, 16, 17, 18]
    # 16 rows are planned now: a row more would cost its share
    assert spec.propose(second, 8, 8, stop_at_forced=False) == []
    spec.begin_step(8)
    assert len(spec.propose(second, 8, 8, stop_at_forced=False)) == 8


def test_a_request_whose_drafts_fail_drafts_shorter():
    spec = speculator(WEIGHTS_BOUND)
    fresh, failing = make_request(token_ids=PROMPT), make_request(token_ids=PROMPT)
    for _ in range(4):
        spec.draft_state(failing).draft_acceptance.add(8, 0)
    spec.begin_step(1)
    long = spec.propose(fresh, 8, 1, stop_at_forced=False)
    spec.begin_step(1)
    short = spec.propose(failing, 8, 1, stop_at_forced=False)
    assert 0 < len(short) < len(long)


def test_drafts_after_longer_ngram_matches_are_priced_by_their_own_record():
    spec = speculator(WEIGHTS_BOUND)
    for ngram, num_accepted in ((1, 0), (3, 8)):  # after 1-gram matches drafts failed, after 3-grams they held
        earlier = make_request(token_ids=PROMPT)
        spec.draft_state(earlier).draft_ngram = ngram
        for _ in range(5):
            spec.record(earlier, 8, num_accepted)
    spec.begin_step(1)
    after_one = spec.propose(make_request(token_ids=PROMPT), 8, 1, stop_at_forced=False)  # "10" matched
    spec.begin_step(1)
    after_three = spec.propose(make_request(token_ids=PROMPT + [11, 12]), 8, 1, stop_at_forced=False)  # "10 11 12"
    assert after_three == [13, 14, 15, 16, 17, 18, 19, 5]
    assert len(after_one) < len(after_three)
