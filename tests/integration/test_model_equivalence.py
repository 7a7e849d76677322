"""Formwork's own Llama over the paged cache against transformers' implementation (fp32)."""
from __future__ import annotations

import pytest
import torch

from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Count from 1 to 20.",
           "Explain recursion in one paragraph."]


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_greedy_tokens_match_transformers_generate(llm_fp32, hf_model):
    llm = llm_fp32
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = llm.generate(conversations, SamplingParams(max_tokens=32, temperature=0))
    for conversation, out in zip(conversations, outputs):
        ids = torch.tensor([llm.tokenizer.encode_chat(conversation)])
        with torch.inference_mode():
            ref = hf_model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:]
        assert out.token_ids == ref.tolist(), (out.text, llm.tokenizer.decode(ref.tolist()))


class RecordingSampler:
    """Wraps the runner's sampler and keeps a copy of the logits it is given."""

    def __init__(self, sampler):
        self.sampler, self.logits = sampler, []

    def __call__(self, logits, *args):
        self.logits.append(logits.clone())
        return self.sampler(logits, *args)


def test_last_position_logits_within_1e_3(llm_fp32, hf_model):
    llm = llm_fp32
    from engine.protocol import EngineCoreRequest
    runner = llm.engine.runner
    recorder = runner.sampler = RecordingSampler(runner.sampler)
    try:
        prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
        for i, ids in enumerate(prompts):
            llm.engine.add_request(EngineCoreRequest(f"logits-{i}", ids, SamplingParams(max_tokens=1, temperature=0)))
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    finally:
        runner.sampler = recorder.sampler
    ours = torch.cat(recorder.logits)
    assert ours.shape[0] == len(prompts)
    for row, ids in enumerate(prompts):
        with torch.inference_mode():
            ref = hf_model(torch.tensor([ids])).logits[0, -1].float()
        assert torch.allclose(ours[row], ref, atol=1e-3, rtol=0), (ours[row] - ref).abs().max()


def test_default_dtype_keeps_the_answers(llm, llm_fp32):
    """bf16 (the default on CPUs with bf16 dot products) must keep the model's greedy answers:
    the first tokens of each answer agree with float32, and the answer to a fact question holds."""
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    params = SamplingParams(max_tokens=8, temperature=0)
    ours = llm.generate(conversations, params)
    ref = llm_fp32.generate(conversations, params)
    assert sum(o.token_ids[:4] == r.token_ids[:4] for o, r in zip(ours, ref)) >= len(PROMPTS) - 1
    assert "Paris" in ours[0].text, ours[0].text
