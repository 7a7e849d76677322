"""Speculative decoding on the real model in float32: token for token the output of decoding
without drafts, on the json-extraction workload (jump-forward, prefix caching and closing early on,
as served) and on free text, with stop strings and logprobs; and every KV block back afterwards.

One engine serves both sides: a request switches drafting on or off (SamplingParams.speculative).
"""
from __future__ import annotations

import json

import pytest

from bench.workloads import extraction_prompt, load_json_extraction
from engine.sampling_params import SamplingParams
from engine.spec_decode.speculator import TEXT_MATCHED
from engine.spec_decode.step_cost import StepCostModel
from grammar.constraint import Constraint

pytestmark = pytest.mark.slow

COPY = [{"role": "user", "content": "Copy this sentence exactly, nothing else: The committee approved the "
                                    "budget of 4.2 million euros for the new library on 12 March 2024."}]
FREE = [[{"role": "user", "content": "Tell me about owls."}],
        [{"role": "user", "content": "Write a short poem about bread."}],
        "The list of the planets, in order from the sun: Mercury, Venus, Earth,",
        COPY]


@pytest.fixture(autouse=True)
def drafts_at_full_length(request, monkeypatch):
    """How long a draft is, is priced from the step times the machine measures as it runs
    (engine/spec_decode/speculator.py: tests/engine/test_speculative_scheduling.py checks the pricing), so on a
    loaded machine a short copy may draft nothing and its exactness check would check nothing.
    Unmeasured, every match drafts at full length: the most drafting, the strictest check."""
    llm = request.getfixturevalue("llm" if "llm" in request.fixturenames else "llm_fp32")
    speculator = llm.engine.speculator
    monkeypatch.setattr(speculator, "step_cost", StepCostModel())
    monkeypatch.setattr(speculator, "observe_step", lambda num_tokens, seconds: None)


def both(llm, prompts, **params):
    """(without drafts, with drafts): the outputs of the same requests."""
    off = llm.generate(prompts, SamplingParams(temperature=0, speculative=False, **params))
    on = llm.generate(prompts, SamplingParams(temperature=0, speculative=True, **params))
    return off, on


def assert_all_blocks_free(llm):
    pool = llm.engine.scheduler.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks - 1


def test_json_extraction_outputs_are_identical_with_drafts(llm_fp32):
    items = load_json_extraction()[:12]
    prompts = [extraction_prompt(item) for item in items]
    outputs = {}
    for speculative in (False, True):  # the second pass also meets the first one's cached prefixes
        params = [SamplingParams(temperature=0, max_tokens=128, speculative=speculative,
                                 constraint=Constraint(kind="json_schema", spec=json.dumps(item["schema"])))
                  for item in items]
        outputs[speculative] = llm_fp32.generate(prompts, params)
    off, on = outputs[False], outputs[True]
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert [o.finish_reason for o in on] == [o.finish_reason for o in off]
    assert sum(o.counters.num_draft_tokens for o in off) == 0
    accepted = sum(o.counters.num_accepted_draft_tokens for o in on)
    assert accepted > 0 and sum(o.counters.num_draft_tokens for o in on) >= accepted
    forced_on, forced_off = (sum(o.counters.num_forced_tokens for o in outs) for outs in (on, off))
    assert forced_on == forced_off > 0  # jump-forward
    assert all(o.counters.num_cached_tokens > 0 for o in on)  # prefix caching
    assert sum(o.counters.num_forward_passes for o in on) < sum(o.counters.num_forward_passes for o in off)
    assert_all_blocks_free(llm_fp32)
    # some drafts were read from the prompt's text, and the outputs above are the same with them
    assert llm_fp32.engine.speculator.acceptance[TEXT_MATCHED].tried > 0


def test_free_text_outputs_are_identical_with_drafts(llm_fp32):
    off, on = both(llm_fp32, FREE, max_tokens=48)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    copy_off, copy_on = off[-1], on[-1]
    assert "4.2 million euros" in copy_on.text
    assert copy_on.counters.num_accepted_draft_tokens >= 8  # the copied sentence is drafted and accepted
    assert copy_on.counters.num_forward_passes < copy_off.counters.num_forward_passes
    assert_all_blocks_free(llm_fp32)


def test_stop_string_and_logprobs_are_the_same_with_drafts(llm_fp32):
    off, on = both(llm_fp32, [COPY], max_tokens=48, stop=["library"], logprobs=2)
    assert on[0].text == off[0].text and on[0].token_ids == off[0].token_ids
    assert on[0].stop_reason == off[0].stop_reason == "library"
    # ended by the front end on the stop string: the draft counts come from the outputs before
    assert on[0].counters.num_draft_tokens >= on[0].counters.num_accepted_draft_tokens > 0
    assert [lp.token_id for lp in on[0].logprobs] == [lp.token_id for lp in off[0].logprobs]
    for a, b in zip(on[0].logprobs, off[0].logprobs):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
    assert_all_blocks_free(llm_fp32)


def extraction_both_ways(llm, items, max_tokens: int, at_a_time: int) -> dict[bool, list]:
    """{speculative: the outputs}: the items' constrained greedy answers, `at_a_time` requests at once."""
    prompts = [extraction_prompt(item) for item in items]
    outputs = {}
    for speculative in (False, True):
        params = [SamplingParams(temperature=0, max_tokens=max_tokens, speculative=speculative,
                                 constraint=Constraint(kind="json_schema", spec=json.dumps(item["schema"])))
                  for item in items]
        outputs[speculative] = [o for i in range(0, len(items), at_a_time)
                                for o in llm.generate(prompts[i:i + at_a_time], params[i:i + at_a_time])]
    return outputs


def test_closing_early_under_a_small_budget_is_the_same_with_drafts(llm_fp32):
    outputs = extraction_both_ways(llm_fp32, load_json_extraction()[:6], max_tokens=40, at_a_time=6)
    assert [o.token_ids for o in outputs[True]] == [o.token_ids for o in outputs[False]]
    assert [o.closed_early for o in outputs[True]] == [o.closed_early for o in outputs[False]]
    assert_all_blocks_free(llm_fp32)


def test_bf16_outputs_are_identical_with_drafts(llm):
    """The default dtype: the kernels' bf16 rows do not depend on how many rows a step verifies, so
    drafting is on by default on CPU and changes no greedy token (two requests at a time: drafting
    is on at low concurrency)."""
    outputs = extraction_both_ways(llm, load_json_extraction()[12:16], max_tokens=96, at_a_time=2)
    assert [o.token_ids for o in outputs[True]] == [o.token_ids for o in outputs[False]]
    assert sum(o.counters.num_accepted_draft_tokens for o in outputs[True]) > 0
    assert_all_blocks_free(llm)
