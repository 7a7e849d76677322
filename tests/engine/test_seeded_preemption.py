"""A seeded request samples the same tokens whether or not it was preempted (and recomputed) on the way.

Runs the scheduler and the model runner by hand on a tiny random model (no tokenizer needed), once
with a KV cache large enough for everyone and once with one so small that requests keep preempting
each other.
"""
from __future__ import annotations

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams
from engine.sched.request import Request

VOCAB = 384
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random 2-layer Llama with a 384-token vocabulary, saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=MAX_MODEL_LEN, tie_word_embeddings=True,
                         initializer_range=0.2)  # spread-out logits: sampling has real choices
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-random")
    LlamaForCausalLM(config).save_pretrained(out)
    return out, config


def generate(tiny_model, num_blocks: int, params: list[SamplingParams], prompts: list[list[int]]):
    """Every request to the end; returns (output token ids per request, number of preemptions)."""
    from engine.sched.scheduler import Scheduler
    from engine.worker.model_runner import ModelRunner

    model_dir, hf_config = tiny_model
    config = EngineConfig(model=str(model_dir), dtype="float32",
                          scheduler=SchedulerConfig(max_num_seqs=len(prompts), max_num_batched_tokens=256),
                          cache=CacheConfig(block_size=16, num_blocks=num_blocks))
    runner = ModelRunner(config, model_dir, hf_config, MAX_MODEL_LEN)
    scheduler = Scheduler(config.scheduler, config.cache, runner.num_blocks, MAX_MODEL_LEN)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        scheduler.add_request(Request(f"r{i}", prompt, p, eos_token_id=None, arrival_time=float(i)))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(10_000):
        if not scheduler.has_unfinished_requests():
            break
        scheduler_output = scheduler.schedule()
        runner.execute_model(scheduler_output)
        for out in scheduler.update_from_output(scheduler_output, runner.sample_tokens(None)):
            tokens[out.request_id] += out.new_token_ids
    assert not scheduler.has_unfinished_requests()
    return [tokens[f"r{i}"] for i in range(len(prompts))], scheduler.num_preemptions


def test_seeded_sampling_survives_preemption(tiny_model):
    prompts = [[(7 * i + j) % (VOCAB - 3) + 3 for j in range(6 + i % 5)] for i in range(12)]
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=100 + i, ignore_eos=True,
                             top_p=0.95 if i % 3 == 0 else 1.0) for i in range(12)]
    expected, num_preemptions = generate(tiny_model, num_blocks=128, params=params, prompts=prompts)
    assert num_preemptions == 0
    assert all(len(t) == 40 for t in expected)
    assert len({tuple(t) for t in expected}) == 12  # sampling, not a constant
    # 12 requests of up to 50 tokens (4 blocks each) in 11 usable blocks: constant preemption
    got, num_preemptions = generate(tiny_model, num_blocks=12, params=params, prompts=prompts)
    assert num_preemptions >= 6
    assert got == expected

