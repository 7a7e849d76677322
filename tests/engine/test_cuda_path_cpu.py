"""The CUDA path's logic on the CPU: padded decode replay (graph capture off), graph sizes, KV
sizing from device memory, CUDA options. tests/engine/test_gpu.py runs the real thing on a GPU."""
from __future__ import annotations

import pytest
import torch

from engine.attention.sdpa import SdpaAttentionBackend
from engine.config import CacheConfig, CudaConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams
from engine.worker.cuda_graph import DecodeGraphRunner, capture_sizes
from engine.worker.device_memory import StepShape, activation_reserve_bytes, num_blocks_from_free_memory


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert capture_sizes(48) == [1, 2, 4, 8, 16, 32, 48]


def test_cuda_config_is_validated():
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CudaConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="attention_backend"):
        CudaConfig(attention_backend="xformers")


def test_dtype_auto_is_bfloat16_on_cuda_and_bf16_cpus(monkeypatch):
    from engine import config
    monkeypatch.setattr(config, "cpu_has_bf16_dot", lambda: False)
    assert EngineConfig().torch_dtype == "float32"
    monkeypatch.setattr(config, "cpu_has_bf16_dot", lambda: True)
    assert EngineConfig().torch_dtype == "bfloat16"
    assert EngineConfig(dtype="float32").torch_dtype == "float32"
    assert EngineConfig(device="cuda").torch_dtype == "bfloat16"
    assert EngineConfig(device="cuda:1").torch_dtype == "bfloat16"
    assert EngineConfig(device="cuda", dtype="float32").torch_dtype == "float32"
    with pytest.raises(ValueError, match="dtype must be"):
        EngineConfig(dtype="fp8")


SHAPE = StepShape(max_num_seqs=64, max_num_batched_tokens=512, max_model_len=2048, hidden_size=576,
                  intermediate_size=1536, num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152, dtype_bytes=2)


def test_kv_blocks_from_free_memory(monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * gib, 80 * gib))  # 10 GiB in use
    bytes_per_block = 1 << 20
    expected = (int(0.5 * 80 * gib) - 10 * gib - activation_reserve_bytes(SHAPE)) // bytes_per_block
    assert num_blocks_from_free_memory(torch.device("cuda"), 0.5, bytes_per_block, SHAPE) == expected
    assert 30_720 - 4096 < expected < 30_720 - 1024  # 30 GiB less a reserve of 1-4 GiB, in MiB blocks
    with pytest.raises(ValueError, match="raise gpu_memory_utilization"):
        num_blocks_from_free_memory(torch.device("cuda"), 0.1, bytes_per_block, SHAPE)


@pytest.fixture(scope="module")
def tiny_model_dir(model_dir, tmp_path_factory):
    """SmolLM2's tokenizer with a random 2-layer model (GQA 4:2): fast enough for CPU tests."""
    from bench.random_model import build_random_model
    return build_random_model(model_dir, tmp_path_factory.mktemp("tiny"), seed=0, num_hidden_layers=2,
                              hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16)


def tiny_llm(model_dir, max_num_seqs: int = 6):
    from engine.llm import LLM
    # float32: the replay must equal the CPU path token for token (bf16 rounds differently per batch shape)
    return LLM(config=EngineConfig(model=str(model_dir), dtype="float32",
                                   scheduler=SchedulerConfig(max_num_seqs=max_num_seqs),
                                   cache=CacheConfig(num_blocks=256)))


@pytest.mark.slow  # needs the default model's tokenizer
def test_padded_decode_replay_equals_the_cpu_path(tiny_model_dir):
    prompts = [f"Tell me about {topic}." + " Go on." * i for i, topic in
               enumerate(["owls", "bread", "rivers", "salt", "kites", "maps", "bees"])]
    # different lengths: the batch shrinks step by step, so most decode steps run padded
    # no drafts, as on CUDA by default: a draft step replays no graph
    params = [SamplingParams(max_tokens=4 + 3 * i, temperature=0, ignore_eos=True, speculative=False)
              for i in range(len(prompts))]
    reference = tiny_llm(tiny_model_dir)
    try:
        expected = [o.token_ids for o in reference.generate(prompts, params)]
    finally:
        reference.shutdown()
    llm = tiny_llm(tiny_model_dir)
    try:
        runner = llm.engine.runner
        runner.attn_backend = SdpaAttentionBackend()  # what CUDA uses without flash-attn
        runner.decode_graphs = graphs = DecodeGraphRunner(
            runner.model, runner.kv_caches, runner.attn_backend, max_num_seqs=6,
            max_blocks_per_req=runner.input_batch.block_table.shape[1], block_size=runner.block_size,
            device=runner.device, capture=False)
        got = [o.token_ids for o in llm.generate(prompts, params)]
    finally:
        llm.shutdown()
    assert got == expected
    assert graphs.num_runs >= 20
    shapes = set(graphs._graphs)
    assert {b for b, _ in shapes} >= {6, 4, 2, 1}  # 7 requests, at most 6 at once: 6, 5->6, 3->4, 2, 1
    assert len({n for _, n in shapes}) >= 2  # contexts grew past a block-count bucket
