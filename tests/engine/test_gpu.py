"""The engine on CUDA: equivalence with transformers, batch invariance, CUDA graphs, constraints.

Run with `pytest -m gpu` on a machine with CUDA; everything here is skipped without it.
FORMWORK_GPU_MODEL names the model folder (the GPU check builds a random-weight SmolLM2 there,
bench/random_model.py); without it the default model is used.

Precision: float32 runs must match transformers token for token and batched runs must match
lone runs exactly (scheduling, paging, padding and graph replay change nothing). In bfloat16,
cuBLAS picks kernels by batch size, so a different batch can round differently; there the
tests bound the difference instead: every token the engine picks is within BF16_GAP of the
best logit of transformers' float32 forward over the same text.
"""
from __future__ import annotations

import gc
import json
import os

import pytest
import torch

from engine.config import CacheConfig, CudaConfig, EngineConfig, SchedulerConfig
from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Count from 1 to 20.",
           "Explain recursion in one paragraph."]
TOPICS = ["the moon", "bread", "rivers", "chess", "volcanoes", "owls", "glass", "trains",
          "coffee", "maps", "clocks", "bees", "salt", "kites", "bridges", "snow"]
SYSTEM = "You are a careful assistant for a museum. Answer in plain sentences and keep every answer short."
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
# request i stops after 10 + 2i tokens: the batch shrinks step by step, so decode graphs replay padded
STAGGERED = [SamplingParams(max_tokens=10 + 2 * i, temperature=0, ignore_eos=True) for i in range(len(TOPICS))]
BF16_GAP = 0.1  # logits of a random SmolLM2 have std ~0.48; a wrong token is typically ~2 below the best


@pytest.fixture(scope="module")
def gpu_model_dir():
    from engine.model_files import resolve_model
    return resolve_model(os.environ.get("FORMWORK_GPU_MODEL"))


def make_llm(model_dir, dtype: str = "auto", max_num_seqs: int = 16, budget: int = 512,
             num_blocks: int | None = 4096, enforce_eager: bool = False, utilization: float = 0.9):
    from engine.llm import LLM
    return LLM(config=EngineConfig(
        model=str(model_dir), device="cuda", dtype=dtype,
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget),
        cache=CacheConfig(num_blocks=num_blocks), grammar=GrammarConfig(),
        cuda=CudaConfig(enforce_eager=enforce_eager, gpu_memory_utilization=utilization)))


def close(llm) -> None:
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def conversations(with_system: bool = False) -> list[list[dict]]:
    system = [{"role": "system", "content": SYSTEM}] if with_system else []
    return [system + [{"role": "user", "content": f"Tell me about {t}." + " Give detail and history." * (i % 4)}]
            for i, t in enumerate(TOPICS)]


@pytest.fixture(scope="module")
def hf_model(gpu_model_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(gpu_model_dir, dtype=torch.float32).to("cuda").eval()
    yield model
    del model
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def fp32_llm(gpu_model_dir):
    llm = make_llm(gpu_model_dir, dtype="float32")
    yield llm
    close(llm)


def test_fp32_greedy_matches_transformers(fp32_llm, hf_model):
    conv = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = fp32_llm.generate(conv, SamplingParams(max_tokens=32, temperature=0))
    for c, out in zip(conv, outputs):
        ids = torch.tensor([fp32_llm.tokenizer.encode_chat(c)], device="cuda")
        with torch.inference_mode():
            ref = hf_model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:]
        assert out.token_ids == ref.tolist()
    runner = fp32_llm.engine.runner
    assert type(runner.attn_backend).__name__ in ("SdpaAttentionBackend", "FlashAttentionBackend")
    assert runner.decode_graphs is not None and runner.decode_graphs.num_runs > 0  # decode ran as graphs


def test_fp32_batch_invariance_with_graphs_chunks_and_prefix_cache(fp32_llm, gpu_model_dir):
    alone = {s: [fp32_llm.generate([c], p)[0].token_ids for c, p in zip(conversations(s), STAGGERED)]
             for s in (False, True)}
    graphs = fp32_llm.engine.runner.decode_graphs
    # batched: 16 at once, decode graphs replayed at padded sizes as requests finish
    assert [o.token_ids for o in fp32_llm.generate(conversations(), STAGGERED)] == alone[False]
    assert {batch for batch, _ in graphs._graphs} >= {1, 2, 4, 8, 16}
    pool = fp32_llm.engine.scheduler.kv_cache_manager.pool
    hits = pool.num_hits
    assert [o.token_ids for o in fp32_llm.generate(conversations(True), STAGGERED)] == alone[True]
    assert pool.num_hits > hits  # the shared system prompt came from the prefix cache
    for kwargs in ({"budget": 24}, {"enforce_eager": True}):  # chunked prefill; no graphs at all
        other = make_llm(gpu_model_dir, dtype="float32", **kwargs)
        try:
            assert [o.token_ids for o in other.generate(conversations(), STAGGERED)] == alone[False], kwargs
        finally:
            close(other)


def test_fp32_last_position_logits_close_to_transformers(fp32_llm, hf_model):
    from engine.protocol import EngineCoreRequest
    runner = fp32_llm.engine.runner
    seen = []
    sampler = runner.sampler
    runner.sampler = lambda logits, *args: (seen.append(logits.clone()), sampler(logits, *args))[1]
    try:
        prompts = [fp32_llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
        for i, ids in enumerate(prompts):
            fp32_llm.engine.add_request(EngineCoreRequest(f"gpu-logits-{i}", ids, SamplingParams(max_tokens=1,
                                                                                                 temperature=0)))
        while fp32_llm.engine.has_unfinished_requests():
            fp32_llm.engine.step()
    finally:
        runner.sampler = sampler
    ours = torch.cat(seen)
    for row, ids in enumerate(prompts):
        with torch.inference_mode():
            ref = hf_model(torch.tensor([ids], device="cuda")).logits[0, -1].float()
        torch.testing.assert_close(ours[row], ref, atol=1e-3, rtol=0)


def test_bf16_tokens_are_near_argmax_of_transformers_fp32(gpu_model_dir, hf_model):
    llm = make_llm(gpu_model_dir)
    try:
        conv = [[{"role": "user", "content": p}] for p in PROMPTS] + conversations()[:4]
        outputs = llm.generate(conv, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
        gaps = []
        for c, out in zip(conv, outputs):
            ids = llm.tokenizer.encode_chat(c)
            with torch.inference_mode():
                logits = hf_model(torch.tensor([ids + out.token_ids], device="cuda")).logits[0].float()
            rows = logits[len(ids) - 1:len(ids) - 1 + len(out.token_ids)]
            picked = rows.gather(1, torch.tensor(out.token_ids, device="cuda")[:, None])[:, 0]
            gaps += (rows.max(dim=1).values - picked).tolist()
        exact = sum(g == 0 for g in gaps) / len(gaps)
        assert max(gaps) <= BF16_GAP, (max(gaps), exact)
        assert exact >= 0.9, exact
        assert llm.engine.runner.model.embed_tokens.weight.dtype == torch.bfloat16  # "auto" on CUDA
        assert llm.engine.runner.kv_caches[0].dtype == torch.bfloat16
    finally:
        close(llm)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["bird", "fish", "tree"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "kind", "count", "ok", "tags"],
    "additionalProperties": False,
}


def test_constrained_outputs_are_valid(gpu_model_dir):
    import jsonschema

    from grammar import bitmask
    llm = make_llm(gpu_model_dir)
    try:
        assert "cuda" in bitmask._device_kernels  # xgrammar's CUDA kernel applies the masks
        conv = conversations()[:8]
        json_params = [SamplingParams(max_tokens=200, temperature=t, seed=i,
                                      constraint=Constraint(kind="json_schema", spec=json.dumps(SCHEMA)))
                       for i, t in enumerate([0, 1.0] * 4)]  # greedy (masked argmax) and sampled rows in one batch
        unconstrained = [SamplingParams(max_tokens=40, temperature=1.0, seed=7)] * 4
        regex = SamplingParams(max_tokens=40, temperature=1.0, seed=3,
                               constraint=Constraint(kind="regex", spec=r"[a-z]{3,8}@example\.(com|org)"))
        choice = SamplingParams(max_tokens=10, temperature=0,
                                constraint=Constraint(kind="choice", choices=["yes", "no", "maybe not"]))
        outputs = llm.generate(conv + conv[:4] + conv[:2], json_params + unconstrained + [regex, choice])
        for out in outputs[:8]:
            assert out.finish_reason == FinishReason.STOP, (out.text, out.finish_reason)
            jsonschema.validate(json.loads(out.text), SCHEMA)
        assert outputs[12].finish_reason == FinishReason.STOP
        assert outputs[12].text.split("@")[1] in ("example.com", "example.org")
        assert outputs[13].text in ("yes", "no", "maybe not")
    finally:
        close(llm)


def test_kv_cache_takes_what_gpu_memory_utilization_leaves(gpu_model_dir):
    gc.collect()
    torch.cuda.empty_cache()
    _, total = torch.cuda.mem_get_info()
    llm = make_llm(gpu_model_dir, num_blocks=None, utilization=0.3)
    try:
        runner = llm.engine.runner
        kv_bytes = sum(t.numel() * t.element_size() for t in runner.kv_caches)
        assert kv_bytes > 0.15 * total  # the weights are small: most of the 30% is KV cache
        assert torch.cuda.memory_allocated() < 0.3 * total
        assert runner.num_blocks == llm.engine.scheduler.kv_cache_manager.pool.num_blocks
        out = llm.generate([conversations()[0]], GREEDY)[0]
        assert len(out.token_ids) == GREEDY.max_tokens
    finally:
        close(llm)
