"""The paged-attention kernel on runs of a request's queries (a prompt's rows, a chunk's): each query
of a run of L gets the same bits as when it is attended alone, and the right values."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cpu_attention import paged_reference

ROOT = Path(__file__).resolve().parents[2]


def request_tokens(gen, num_tokens, heads, kv_heads, head_dim, dtype):
    """q [n, heads, D], k and v [n, kv_heads, D] of a request's positions (peaked softmax: q scaled)."""
    q = torch.randn(num_tokens, heads, head_dim, generator=gen) * 3
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def scattered_blocks(gen, num_blocks, lengths, block_size):
    """One block-table row per length, each request on its own blocks in a shuffled order."""
    free = torch.randperm(num_blocks, generator=gen).tolist()
    rows = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)


def slots_of(row, positions, block_size):
    return torch.tensor([int(row[p // block_size]) * block_size + p % block_size for p in positions])


# (dtype, head_dim, group, kv heads, block size): the AVX-512 BF16 kernel's shapes (the default
# model's 9/3 heads of 64, the 1.5B model's 12/2 of 128, a group of 1), a block size that is not a
# multiple of the 16-key chunks, the AVX2 kernel's (fp32 and fp16 widened; on an AVX2 build bf16 too)
# and the generic kernel (bf16 with head_dim 96)
RUN_SHAPES = [(torch.bfloat16, 64, 3, 3, 16), (torch.bfloat16, 128, 6, 2, 16), (torch.bfloat16, 64, 1, 2, 7),
              (torch.float32, 64, 3, 3, 16), (torch.float32, 128, 6, 2, 7), (torch.float16, 64, 3, 3, 16),
              (torch.bfloat16, 96, 2, 2, 16)]


@pytest.mark.parametrize("dtype,head_dim,group,kv_heads,block_size", RUN_SHAPES)
@pytest.mark.parametrize("run_length", [1, 3, 17, 700])
@pytest.mark.parametrize("sliding_window,softcap", [(0, 0.0), (37, 20.0)])
def test_a_run_of_queries_equals_each_query_alone(kernels, dtype, head_dim, group, kv_heads, block_size, run_length,
                                                  sliding_window, softcap):
    """A request's last run_length positions after 13 cached ones, attended in one call beside another
    request's run of two, then one query per call: bit for bit the same rows, and close to float64."""
    if run_length == 700 and (dtype, head_dim) == (torch.bfloat16, 96):
        pytest.skip("the generic kernel attends query by query: the shorter runs cover it")
    gen = torch.Generator().manual_seed(run_length + head_dim + group)
    heads, cached = group * kv_heads, 13
    length_a, length_b = cached + run_length, 40
    qa, ka, va = request_tokens(gen, length_a, heads, kv_heads, head_dim, dtype)
    qb, kb, vb = request_tokens(gen, length_b, heads, kv_heads, head_dim, dtype)
    num_blocks = -(-length_a // block_size) + -(-length_b // block_size) + 8
    table = scattered_blocks(gen, num_blocks, [length_a, length_b], block_size)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    # the cached prefix is in the cache already; each call writes this step's tokens (the same values)
    slots_a = slots_of(table[0], range(length_a), block_size)
    cache.view(2, -1, kv_heads, head_dim)[0, slots_a] = ka
    cache.view(2, -1, kv_heads, head_dim)[1, slots_a] = va
    new_a = range(cached, length_a)
    q = torch.cat([qa[cached:], qb[-2:]])
    k, v = torch.cat([ka[cached:], kb[-2:]]), torch.cat([va[cached:], vb[-2:]])
    slot_mapping = torch.cat([slots_a[cached:], slots_of(table[1], range(length_b - 2, length_b), block_size)])
    seq_lens_a = torch.tensor([p + 1 for p in new_a], dtype=torch.int32)
    scale = head_dim ** -0.5

    def attend(query_ids, block_table, seq_lens):
        out = torch.zeros(q.shape, dtype=dtype)
        kernels.paged_attention(out, q, k, v, cache, slot_mapping, torch.tensor(query_ids), block_table, seq_lens,
                                scale, sliding_window, softcap)
        return out

    # request b's two queries first, then a's run
    together = attend(list(range(run_length, run_length + 2)) + list(range(run_length)),
                      torch.cat([table[1:].expand(2, -1), table[:1].expand(run_length, -1)]),
                      torch.cat([torch.tensor([length_b - 1, length_b], dtype=torch.int32), seq_lens_a]))
    for i in range(run_length):
        alone = attend([i], table[:1], seq_lens_a[i:i + 1])
        assert torch.equal(together[i], alone[i]), f"query {i} of the run differs from itself alone"
    expected = paged_reference(q[:run_length], cache, table[:1].expand(run_length, -1), seq_lens_a, sliding_window,
                               softcap)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the output's own rounding
    torch.testing.assert_close(together[:run_length].double(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype,head_dim,group,kv_heads,block_size",
                         [(torch.float32, 64, 3, 3, 16), (torch.float32, 128, 6, 2, 7), (torch.bfloat16, 64, 3, 3, 16)])
@pytest.mark.parametrize("peak", ["last", "first"])
def test_a_max_that_moves_every_chunk(kernels, dtype, head_dim, group, kv_heads, block_size, peak):
    """Scores rising along 1,200 keys to the last ones (each chunk of 16 brings a new max: a softmax
    kept online rescales what came before at every chunk) or falling from the first ones (the last
    chunks, under e^-86, weigh exactly 0): a run of the last 48 queries equals each alone, and float64."""
    gen = torch.Generator().manual_seed(head_dim + group)
    heads, length, run_length = group * kv_heads, 1200, 48
    q, k, v = request_tokens(gen, length, heads, kv_heads, head_dim, torch.float32)
    direction = torch.nn.functional.normalize(torch.randn(kv_heads, head_dim, generator=gen), dim=-1)
    # q.k falls by about 2 / sqrt(head_dim) a key away from the peak: hundreds over the request, and the
    # keys near it small (their fp32 scores as exact as the others')
    distance = (torch.arange(length, dtype=torch.float32) - (length - 1 if peak == "last" else 0)).abs()
    k = (k - 0.25 * distance[:, None, None] * direction).to(dtype)
    q = (q.view(length, kv_heads, group, head_dim) + 8 * direction[:, None]).view(length, heads, head_dim).to(dtype)
    v = v.to(dtype)
    num_blocks = -(-length // block_size) + 4
    table = scattered_blocks(gen, num_blocks, [length], block_size)
    cache = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    slots = slots_of(table[0], range(length), block_size)
    cache.view(2, -1, kv_heads, head_dim)[0, slots] = k
    cache.view(2, -1, kv_heads, head_dim)[1, slots] = v
    new = range(length - run_length, length)
    seq_lens = torch.tensor([p + 1 for p in new], dtype=torch.int32)

    def attend(query_ids):
        out = torch.zeros(run_length, heads, head_dim, dtype=dtype)
        kernels.paged_attention(out, q[new], k[new], v[new], cache, slots[new], torch.tensor(query_ids),
                                table.expand(len(query_ids), -1).contiguous(), seq_lens[query_ids], head_dim ** -0.5)
        return out

    together = attend(list(range(run_length)))
    for i in range(run_length):
        assert torch.equal(together[i], attend([i])[i]), f"query {i} of the run differs from itself alone"
    expected = paged_reference(q[new], cache, table.expand(run_length, -1), seq_lens)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the output's own rounding
    torch.testing.assert_close(together.double(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.slow
def test_the_vector_path_of_a_machine_with_amx(kernels):
    """Where q.k goes to AMX tiles, the AVX-512 BF16 vector path a CPU without AMX takes passes the
    kernel tests too: forced with FORMWORK_CPU_ATTENTION_AMX=0, in a process of its own."""
    if kernels.paged_attention_isa() != "amx_bf16":
        pytest.skip("no AMX here: the other tests ran the vector path")
    env = {**os.environ, "FORMWORK_CPU_ATTENTION_AMX": "0"}
    isa = subprocess.run([sys.executable, "-c", "from engine.kernels.loader import load_cpu_kernels as load; "
                          "print(load().paged_attention_isa())"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert isa.stdout.split()[-1:] == ["avx512_bf16"], isa.stdout + isa.stderr[-2000:]
    tests = [f"{Path(__file__).name}::test_a_run_of_queries_equals_each_query_alone",
             f"{Path(__file__).name}::test_a_max_that_moves_every_chunk", "test_cpu_attention.py"]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
                             *(f"tests/engine/{t}" for t in tests)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


@pytest.mark.slow
def test_the_avx2_build(kernels):
    """The kernels a CPU with AVX2 and FMA but no AVX-512 runs (FORMWORK_CPU_ISA=avx2: their own
    build, bf16 widened too) pass the kernel tests, in a process of their own."""
    env = {**os.environ, "FORMWORK_CPU_ISA": "avx2"}
    isa = subprocess.run([sys.executable, "-c", "from engine.kernels.loader import load_cpu_kernels as load; "
                          "print(load().paged_attention_isa())"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert isa.stdout.split()[-1:] == ["avx2"], isa.stdout + isa.stderr[-2000:]
    tests = [f"{Path(__file__).name}::test_a_run_of_queries_equals_each_query_alone",
             f"{Path(__file__).name}::test_a_max_that_moves_every_chunk", "test_cpu_attention.py"]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
                             *(f"tests/engine/{t}" for t in tests)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


def decode_inputs(gen, lengths, heads, kv_heads, head_dim, block_size, fill=None):
    """One decode per length over a cache of block_size blocks holding each request's keys (the
    same values whatever the block size: drawn by position), every other row `fill` if given;
    the step's k/v are the last keys again."""
    keys = [request_tokens(gen, n, heads, kv_heads, head_dim, torch.bfloat16) for n in lengths]
    num_blocks = sum(-(-n // block_size) for n in lengths) + 4
    table = scattered_blocks(gen, num_blocks, lengths, block_size)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    if fill is not None:
        cache.fill_(fill)
    rows = cache.view(2, -1, kv_heads, head_dim)
    for i, (n, (_, k, v)) in enumerate(zip(lengths, keys)):
        slots = slots_of(table[i], range(n), block_size)
        rows[0, slots], rows[1, slots] = k, v
    q = torch.stack([qi[-1] for qi, _, _ in keys])
    k, v = torch.stack([ki[-1] for _, ki, _ in keys]), torch.stack([vi[-1] for _, _, vi in keys])
    slot_mapping = torch.stack([slots_of(table[i], [n - 1], block_size)[0] for i, n in enumerate(lengths)])
    return q, k, v, cache, slot_mapping, table, torch.tensor(lengths, dtype=torch.int32)


DECODE_LENGTHS = [1, 15, 16, 17, 40, 333, 700]


@pytest.mark.parametrize("head_dim,group,kv_heads", [(64, 3, 3), (128, 6, 2), (64, 1, 2), (64, 8, 1)])
@pytest.mark.parametrize("sliding_window,softcap", [(0, 0.0), (37, 20.0)])
def test_every_block_size_gives_a_decode_the_same_bits(kernels, head_dim, group, kv_heads, sliding_window, softcap):
    """Blocks of 16 or 32 keys (where AMX scores a chunk's K rows straight from the cache) and of 8 or
    24 (chunks transposed first): the same bits for the same keys, alone or all in one call."""
    heads = group * kv_heads
    outputs = {}
    for block_size in (8, 16, 24, 32):
        gen = torch.Generator().manual_seed(head_dim + group)  # the same q, k, v for every layout
        q, k, v, cache, slot_mapping, table, seq_lens = decode_inputs(gen, DECODE_LENGTHS, heads, kv_heads, head_dim,
                                                                      block_size)
        batch = torch.zeros(q.shape, dtype=torch.bfloat16)
        kernels.paged_attention(batch, q, k, v, cache, slot_mapping, torch.arange(len(DECODE_LENGTHS)), table,
                                seq_lens, head_dim ** -0.5, sliding_window, softcap)
        for i in range(len(DECODE_LENGTHS)):
            alone = torch.zeros(q.shape, dtype=torch.bfloat16)
            kernels.paged_attention(alone, q, k, v, cache, slot_mapping, torch.tensor([i]), table[i:i + 1],
                                    seq_lens[i:i + 1], head_dim ** -0.5, sliding_window, softcap)
            assert torch.equal(alone[i], batch[i]), f"block size {block_size}: decode {i} alone differs"
        outputs[block_size] = batch
        expected = paged_reference(q, cache, table, seq_lens, sliding_window, softcap)
        torch.testing.assert_close(batch.double(), expected, atol=2e-2, rtol=2e-2)
    for block_size in (16, 24, 32):
        assert torch.equal(outputs[block_size], outputs[8]), f"block size {block_size} differs from 8"


@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
@pytest.mark.parametrize("sliding_window", [0, 37])
def test_cache_rows_that_are_not_a_querys_keys_never_reach_it(kernels, fill, sliding_window):
    """Every row of the cache but the requests' keys NaN or infinite (freed, never written): the
    outputs are the same bits as over a cache of finite rows."""
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    outputs = []
    for rows in (None, fill):
        gen = torch.Generator().manual_seed(5)
        q, k, v, cache, slot_mapping, table, seq_lens = decode_inputs(gen, DECODE_LENGTHS, heads, kv_heads, head_dim,
                                                                      block_size, rows)
        out = torch.zeros(q.shape, dtype=torch.bfloat16)
        kernels.paged_attention(out, q, k, v, cache, slot_mapping, torch.arange(len(DECODE_LENGTHS)), table, seq_lens,
                                head_dim ** -0.5, sliding_window)
        outputs.append(out)
    assert torch.isfinite(outputs[1]).all()
    assert torch.equal(outputs[0], outputs[1])
