"""Greedy output must not depend on what else is batched, chunked, preempted or cached (in float32)."""
from __future__ import annotations

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "owls", "glass", "trains",
          "coffee", "maps", "clocks", "bees", "salt", "kites", "bridges", "snow"]
SYSTEM = ("You are a careful assistant for a museum. Answer in plain sentences, never in lists, and keep "
          "every answer short, friendly and accurate. Mention one surprising fact when you can.")
PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def prompts(with_system: bool = False) -> list[list[dict]]:
    out = []
    for i, topic in enumerate(TOPICS):
        ask = f"Tell me about {topic}." + (" Please give some detail and history too." * (i % 4))
        messages = [{"role": "user", "content": ask}]
        out.append(([{"role": "system", "content": SYSTEM}] if with_system else []) + messages)
    return out


@pytest.fixture(scope="module")
def alone(llm_fp32):
    """Each prompt generated on its own: the reference."""
    return {key: [llm_fp32.generate([p], PARAMS)[0].token_ids for p in prompts(key)] for key in (False, True)}


def make_llm(**overrides):
    from engine.llm import LLM
    scheduler = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=overrides.pop("budget", 512))
    cache = CacheConfig(num_blocks=overrides.pop("num_blocks", None), enable_prefix_caching=True)
    return LLM(config=EngineConfig(dtype="float32", scheduler=scheduler, cache=cache))


def test_batched_equals_alone(llm_fp32, alone):
    batched = [o.token_ids for o in llm_fp32.generate(prompts(), PARAMS)]
    assert batched == alone[False]


def test_chunked_prefill_equals_alone(alone):
    llm = make_llm(budget=24)  # longer prompts are split over several steps
    try:
        outputs = llm.generate(prompts(), PARAMS)
        assert [o.token_ids for o in outputs] == alone[False]
        assert max(o.num_prompt_tokens for o in outputs) > 2 * 24  # chunked over three steps or more
    finally:
        llm.shutdown()


def test_preemption_equals_alone(alone):
    llm = make_llm(num_blocks=30)  # 16 requests need ~48 blocks: some must be preempted and recomputed
    try:
        outputs = llm.generate(prompts(), PARAMS)
        assert [o.token_ids for o in outputs] == alone[False]
        assert llm.engine.scheduler.num_preemptions > 0
    finally:
        llm.shutdown()


def test_shared_system_prompt_hits_prefix_cache(llm_fp32, alone):
    llm = llm_fp32
    hits_before = llm.engine.scheduler.kv_cache_manager.pool.num_hits
    outputs = llm.generate(prompts(with_system=True), PARAMS)
    assert [o.token_ids for o in outputs] == alone[True]
    assert llm.engine.scheduler.kv_cache_manager.pool.num_hits > hits_before
    assert sum(o.counters.num_cached_tokens for o in outputs) > 0
