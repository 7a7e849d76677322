"""Greedy bf16 output on Formwork's CPU kernels must not depend on what else is batched, on how the
prompt is chunked, or on whether its prefix comes from the prefix cache (one new row)."""
from __future__ import annotations

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
TOPICS = ["the moon", "bread", "rivers", "chess", "owls", "glass", "trains", "bees"]
# prompt lengths in tokens: 16k + 1 ones leave exactly one new row once their blocks are cached
LENGTHS = [33, 49, 70, 97, 140]
OTHER_LENGTHS = [21, 58, 113]  # requests of other lengths batched beside them


def make_llm(prefix_caching: bool, budget: int = 512):
    from engine.llm import LLM
    return LLM(config=EngineConfig(dtype="bfloat16",
                                   scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget),
                                   cache=CacheConfig(num_blocks=256, enable_prefix_caching=prefix_caching)))


def token_prompts(llm, lengths: list[int], first_topic: int = 0) -> list[dict]:
    """Chat prompts of different questions, cut to the given lengths."""
    prompts = []
    for i, length in enumerate(lengths):
        topic = TOPICS[(first_topic + i) % len(TOPICS)]
        ask = f"Tell me about {topic}." + " Please give some detail and history too." * 20
        ids = llm.encode_prompt([{"role": "user", "content": ask}])
        assert len(ids) >= length
        prompts.append({"prompt_token_ids": ids[:length]})
    return prompts


@pytest.fixture(scope="module")
def prefilled(kernels):
    """Each prompt alone, prefilled whole with no prefix cache: the reference."""
    llm = make_llm(prefix_caching=False)
    try:
        prompts = token_prompts(llm, LENGTHS)
        others = token_prompts(llm, OTHER_LENGTHS, first_topic=len(LENGTHS))
        return prompts, others, [llm.generate([p], PARAMS)[0].token_ids for p in prompts]
    finally:
        llm.shutdown()


def test_batched_and_from_the_prefix_cache_equals_alone(prefilled):
    prompts, others, alone = prefilled
    llm = make_llm(prefix_caching=True)
    try:
        batched = llm.generate(prompts + others, PARAMS)[:len(prompts)]
        assert [o.token_ids for o in batched] == alone
        again = llm.generate(prompts, PARAMS)  # one at a time would do too: every prompt is cached now
        assert [o.token_ids for o in again] == alone
        for prompt, output in zip(prompts, again):
            length = len(prompt["prompt_token_ids"])
            if length % 16 == 1:  # all but the last token cached: the one new row
                assert output.counters.num_cached_tokens == length - 1
        cached_alone = [llm.generate([p], PARAMS)[0].token_ids for p in prompts]
        assert cached_alone == alone
    finally:
        llm.shutdown()


def test_chunked_prefill_equals_alone(prefilled):
    prompts, others, alone = prefilled
    llm = make_llm(prefix_caching=False, budget=24)  # prompts prefilled over 2 to 6 steps, beside decodes
    try:
        outputs = llm.generate(others + prompts, PARAMS)[len(others):]
        assert [o.token_ids for o in outputs] == alone
        # alone, its first steps sample no row at all (the head runs on zero rows)
        assert llm.generate([prompts[-1]], PARAMS)[0].token_ids == alone[-1]
    finally:
        llm.shutdown()
