"""The CPU kernels' one-call decoder layer (engine/kernels/csrc/decoder_layer.cpp) computes what the
decoder's op-by-op path computes, bit for bit: the same greedy tokens and the same logprobs for
prompts prefilled in chunks beside decodes, with the default model in bf16 and in float32 (its
matmul weights held as float32 or as bf16: the fp32 GEMM of CPUs without bf16 dot products)."""
from __future__ import annotations

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=3, speculative=False)


def _answers(llm, prompts):
    outputs = llm.generate(prompts, PARAMS)
    return [(o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs]) for o in outputs]


@pytest.mark.parametrize("dtype,weight_dtype", [("bfloat16", "auto"), ("float32", "float32"), ("float32", "bfloat16")])
def test_the_fused_layer_gives_the_op_by_op_bits(kernels, dtype, weight_dtype):
    from engine.llm import LLM
    llm = LLM(config=EngineConfig(dtype=dtype, cpu_weight_dtype=weight_dtype,
                                  scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
                                  cache=CacheConfig(num_blocks=256, enable_prefix_caching=False)))
    try:
        layers = llm.engine.runner.model.layers
        assert all(layer.fused_kernels is kernels for layer in layers)  # Llama's layers, packed: fused
        # prompts longer than the 64-token budget: chunked, beside the others' decodes
        prompts = [llm.encode_prompt([{"role": "user", "content": f"Tell me about {topic}. " * n}])
                   for topic, n in (("owls", 1), ("rivers", 9), ("glass", 4), ("bees", 15))]
        prompts = [{"prompt_token_ids": ids} for ids in prompts]
        fused = _answers(llm, prompts)
        for layer in layers:
            layer.fused_kernels = None
        assert _answers(llm, prompts) == fused
    finally:
        llm.shutdown()
