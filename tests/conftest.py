"""Shared factories. Engine pieces are built small; the real model is loaded once per session."""
from __future__ import annotations

import itertools
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from engine.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from engine.sampling_params import SamplingParams
from engine.sched.request import Request
from engine.sched.scheduler import Scheduler
from engine.spec_decode.speculator import Speculator

_ids = itertools.count()


def make_scheduler(num_blocks: int = 64, block_size: int = 16, max_num_batched_tokens: int = 512,
                   max_num_seqs: int = 16, max_model_len: int = 1024, enable_prefix_caching: bool = True,
                   enable_chunked_prefill: bool = True, structured_output_manager=None) -> Scheduler:
    """A scheduler without speculation: the scripted runners of these tests (sample_step) sample one
    token a request and verify no drafts (tests/engine/test_speculative_scheduling.py drafts)."""
    backend = structured_output_manager.backend if structured_output_manager is not None else None
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        enable_chunked_prefill=enable_chunked_prefill),
        CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=enable_prefix_caching),
        num_blocks, max_model_len, structured_output_manager, Speculator(SpeculativeConfig(enabled=False), backend))


def make_request(num_tokens: int = 10, max_tokens: int = 16, token_ids: list[int] | None = None,
                 request_id: str | None = None, **params) -> Request:
    if token_ids is None:
        start = next(_ids) * 1000  # distinct prompts: no accidental prefix-cache hits
        token_ids = [(start + i) % 30000 + 3 for i in range(num_tokens)]
    return Request(request_id or f"req-{next(_ids)}", token_ids,
                   SamplingParams(max_tokens=max_tokens, temperature=0, **params), eos_token_id=2)


def sample_step(scheduler: Scheduler, scheduler_output, token_id: int = 100):
    """What a runner returns: one token for each request whose catch-up completes; then update."""
    from engine.sched.scheduler_output import ModelRunnerOutput
    sampled = {}
    for req_id in scheduler_output.num_scheduled_tokens:
        request = scheduler.requests[req_id]
        if request.num_computed_tokens == request.num_tokens:
            sampled[req_id] = [token_id]
    return scheduler.update_from_output(
        scheduler_output, ModelRunnerOutput(list(scheduler_output.num_scheduled_tokens), sampled))


@pytest.fixture(scope="session")
def model_dir():
    from engine.model_files import resolve_model
    return resolve_model(None)


@pytest.fixture(scope="session")
def llm(model_dir):
    """The real model with default settings, shared by the whole session."""
    from engine.llm import LLM
    instance = LLM()
    yield instance
    instance.shutdown()


@pytest.fixture(scope="session")
def llm_fp32(model_dir):
    """The real model in float32, for exact comparisons (transformers parity, batch invariance).

    The default dtype is bfloat16 on CPUs with bf16 dot products; bf16 rounds far from transformers'
    float32, and without Formwork's kernels (torch's matmuls) it rounds differently at different
    batch sizes too (tests/integration/test_bf16_batch_invariance.py checks the kernels' bf16 does not)."""
    from engine.config import EngineConfig
    from engine.llm import LLM
    instance = LLM(config=EngineConfig(dtype="float32"))
    yield instance
    instance.shutdown()


@pytest.fixture(scope="session")
def default_server(model_dir):
    """One live `formwork serve` with the default test settings (tests/support/live_server.py: 16 running and
    16 waiting at most, which the queue tests fill), shared by the test modules that need no settings
    of their own: each start loads and warms the model. A module leaves it idle, as it found it."""
    from live_server import MAX_NUM_SEQS, MAX_QUEUE_LEN, LiveServer
    live = LiveServer("--max-num-seqs", str(MAX_NUM_SEQS), "--max-queue-len", str(MAX_QUEUE_LEN),
                      startup_timeout_s=900)  # a shared machine may be building the CPU kernels
    yield live
    assert live.stop() == 0, live.log()


@pytest.fixture(scope="session")
def kernels():
    """Formwork's compiled CPU kernels; a build failure fails the tests that need them (CI has a compiler)."""
    from engine.kernels.loader import load_cpu_kernels
    module = load_cpu_kernels()
    if module is None:
        pytest.fail("the CPU kernels did not build here (see the warning in the log)")
    return module


@pytest.fixture
def make_http_server():
    """In-process front ends (gRPC + HTTP over a fake engine core), closed after the test."""
    from inproc_server import InprocHttp

    servers: list[InprocHttp] = []

    def make(**kwargs) -> InprocHttp:
        servers.append(InprocHttp(**kwargs))
        return servers[-1]
    yield make
    for server in servers:
        server.close()
