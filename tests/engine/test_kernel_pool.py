"""The CPU kernels' worker pool counts who ran a job's chunks (whether the helpers take part)."""
from __future__ import annotations

import torch


def big_gemm(kernels):
    """A prompt-sized GEMM (the pool splits it into chunks), and a call that runs it."""
    x = torch.randn(512, 576).bfloat16()
    packed = kernels.pack_weight(torch.randn(1536, 576).bfloat16())
    return lambda: kernels.gemm(x, packed, 1536)


def test_the_pool_counts_its_jobs_and_who_ran_their_chunks(kernels):
    run = big_gemm(kernels)
    before = kernels.pool_stats()
    for _ in range(5):
        run()
    after = kernels.pool_stats()
    d = {key: after[key] - before[key] for key in before}
    if torch.get_num_threads() == 1:  # no helpers: every chunk on the caller, no jobs for the pool
        assert d["jobs"] == 0 and d["helper_chunks"] == 0
        return
    assert d["jobs"] >= 5
    assert d["chunks"] >= 2 * d["jobs"]
    assert 0 <= d["joined_jobs"] <= d["jobs"]
    assert 0 <= d["helper_chunks"] <= d["chunks"]
    assert d["same_cpu"] <= d["joined_jobs"]
