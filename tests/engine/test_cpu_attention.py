"""The CPU attention backend: its compiled paged attention kernel, its torch fallback, bf16 caches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_steps import STEPS, make_step, reference, write_kv_by_hand

from engine.attention import AttentionInputs, AttentionOptions, write_kv
from engine.attention.cpu import CpuAttentionBackend
from engine.kernels import loader as cpu_kernels


def paged_reference(q, cache, block_table, seq_lens, sliding_window=0, softcap=0.0):
    """Each request alone, in float64: gather its blocks, keep the window's keys, then softmax
    attention of plainly computed (and capped) scores."""
    block_size, num_kv_heads, head_dim = cache.shape[2:]
    group = q.shape[1] // num_kv_heads
    out = []
    for i in range(q.shape[0]):
        length = int(seq_lens[i])
        first = max(0, length - sliding_window) if sliding_window else 0
        blocks = block_table[i, :-(-length // block_size)].long()
        k = cache[0][blocks].reshape(-1, num_kv_heads, head_dim)[first:length].double()
        v = cache[1][blocks].reshape(-1, num_kv_heads, head_dim)[first:length].double()
        k, v = k.repeat_interleave(group, dim=1).transpose(0, 1), v.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (k @ q[i].double().unsqueeze(-1)).squeeze(-1) * head_dim ** -0.5  # [H, keys]
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        out.append((scores.softmax(-1).unsqueeze(1) @ v).squeeze(1))
    return torch.stack(out)


def kernel_inputs(dtype, head_dim=64, group=3, kv_heads=3, num_tokens=24, num_queries=21):
    """A step of num_tokens tokens with q/k/v as strided views of one fused projection (as the
    decoder passes them), of which num_queries are attended over scattered blocks of any length."""
    gen = torch.Generator().manual_seed(1)
    heads = group * kv_heads
    cache = torch.randn(2, 300, 16, kv_heads, head_dim, generator=gen).to(dtype)
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    qkv[:, :heads * head_dim] *= 3  # peaked softmax: the max subtraction matters
    qkv = qkv.to(dtype)
    bounds = ((0, heads), (heads, heads + kv_heads), (heads + kv_heads, heads + 2 * kv_heads))
    q, k, v = (qkv[:, a * head_dim:b * head_dim].view(num_tokens, b - a, head_dim) for a, b in bounds)
    slot_mapping = torch.randperm(300 * 16, generator=gen)[:num_tokens]
    query_ids = torch.randperm(num_tokens, generator=gen)[:num_queries]
    seq_lens = torch.randint(1, 400, (num_queries,), generator=gen, dtype=torch.int32)
    edges = torch.tensor([400, 1, 16, 17], dtype=torch.int32)  # the whole table, one key, block edges
    seq_lens[:4] = edges[:num_queries]
    block_table = torch.stack([torch.randperm(300, generator=gen)[:25] for _ in range(num_queries)]).int()
    return cache, q, k, v, slot_mapping, query_ids, block_table, seq_lens


# (dtype, head_dim, group, kv heads): the bf16 cases with head_dim 64/128 and groups up to 8 take
# the AVX-512 BF16 kernel where the CPU has it; the others the generic one
KERNEL_SHAPES = [(torch.float32, 64, 3, 3), (torch.bfloat16, 64, 3, 3), (torch.bfloat16, 128, 1, 2),
                 (torch.bfloat16, 64, 4, 2), (torch.bfloat16, 96, 3, 1), (torch.bfloat16, 64, 9, 1),
                 (torch.float32, 128, 2, 2)]


@pytest.mark.parametrize("dtype,head_dim,group,kv_heads", KERNEL_SHAPES)
@pytest.mark.parametrize("num_tokens,num_queries", [(24, 21), (2, 1)])  # many queries (threads), one
def test_kernel_writes_the_step_then_reads_scattered_blocks(kernels, dtype, head_dim, group, kv_heads, num_tokens,
                                                            num_queries):
    cache, q, k, v, slot_mapping, query_ids, block_table, seq_lens = kernel_inputs(
        dtype, head_dim, group, kv_heads, num_tokens, num_queries)
    expected_cache = write_kv_by_hand(cache, k, v, slot_mapping)
    out = torch.full(q.shape, 7.0, dtype=dtype)
    kernels.paged_attention(out, q, k, v, cache, slot_mapping, query_ids, block_table, seq_lens, head_dim ** -0.5)
    assert torch.equal(cache, expected_cache)
    expected = paged_reference(q[query_ids].double(), expected_cache, block_table, seq_lens)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    torch.testing.assert_close(out[query_ids].double(), expected, atol=tolerance, rtol=tolerance)
    untouched = torch.ones(q.shape[0], dtype=torch.bool)
    untouched[query_ids] = False
    assert (out[untouched] == 7.0).all()


@pytest.mark.parametrize("dtype,head_dim,group,kv_heads", [(torch.bfloat16, 64, 3, 3), (torch.float32, 64, 3, 3),
                                                          (torch.bfloat16, 96, 2, 2), (torch.bfloat16, 128, 4, 1)])
@pytest.mark.parametrize("sliding_window,softcap", [(1, 0.0), (16, 0.0), (37, 0.0), (0, 5.0), (20, 30.0), (500, 2.0)])
def test_kernel_sliding_window_and_softcap(kernels, dtype, head_dim, group, kv_heads, sliding_window, softcap):
    """Each query sees its last sliding_window keys (itself included), scores bent by softcap * tanh(s / softcap);
    windows shorter, longer and at block edges of the queries' lengths (1 to 400 keys)."""
    assert {"sliding_window", "softcap"} <= set(kernels.paged_attention_features)
    cache, q, k, v, slot_mapping, query_ids, block_table, seq_lens = kernel_inputs(dtype, head_dim, group, kv_heads)
    out = torch.zeros(q.shape, dtype=dtype)
    kernels.paged_attention(out, q, k, v, cache, slot_mapping, query_ids, block_table, seq_lens, head_dim ** -0.5,
                            sliding_window, softcap)
    expected = paged_reference(q[query_ids], cache, block_table, seq_lens, sliding_window, softcap)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    torch.testing.assert_close(out[query_ids].double(), expected, atol=tolerance, rtol=tolerance)
    plain = paged_reference(q[query_ids], cache, block_table, seq_lens)
    assert (out[query_ids].double() - plain).abs().max() > 10 * tolerance  # the window or the cap changed something


def test_kernel_rejects_mismatched_inputs(kernels):
    cache, q, k, v, slot_mapping, query_ids, block_table, seq_lens = kernel_inputs(torch.float32)
    out = torch.empty(q.shape)
    with pytest.raises(RuntimeError, match="head shapes"):
        kernels.paged_attention(out[:, :8], q[:, :8], k, v, cache, slot_mapping, query_ids, block_table, seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="int32"):
        kernels.paged_attention(out, q, k, v, cache, slot_mapping, query_ids, block_table.long(), seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="dtype"):
        kernels.paged_attention(out, q.bfloat16(), k, v, cache, slot_mapping, query_ids, block_table, seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="one k, v, out row"):
        kernels.paged_attention(out, q, k, v, cache, slot_mapping[:-1], query_ids, block_table, seq_lens, 1.0)
    with pytest.raises(RuntimeError, match="sliding_window"):
        kernels.paged_attention(out, q, k, v, cache, slot_mapping, query_ids, block_table, seq_lens, 1.0, -1)
    with pytest.raises(RuntimeError, match="softcap"):
        kernels.paged_attention(out, q, k, v, cache, slot_mapping, query_ids, block_table, seq_lens, 1.0, 0, -2.0)
    with pytest.raises(RuntimeError, match="capacity"):
        kernels.paged_attention(out, q, k, v, cache, slot_mapping, query_ids, block_table, seq_lens + 400, 1.0)


@pytest.mark.parametrize("step", list(STEPS))
def test_torch_fallback_matches_the_reference(step):
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = CpuAttentionBackend()
    backend.kernels = None  # as on a machine without a compiler
    out = backend.forward(q, k, v, cache.clone(), backend.build_metadata(inputs))
    torch.testing.assert_close(out.double(), reference(inputs, cache, q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("step", list(STEPS))
def test_bf16_model_with_bf16_cache(kernels, step):
    """A bf16 model writes bf16 K/V and gets bf16 outputs; the math inside is fp32."""
    inputs, cache, q, k, v = make_step(*STEPS[step])
    backend = CpuAttentionBackend()
    assert backend.kv_cache_dtype(torch.bfloat16) == torch.bfloat16
    cache16, q16, k16, v16 = cache.bfloat16(), q.bfloat16(), k.bfloat16(), v.bfloat16()
    ours = cache16.clone()
    out = backend.forward(q16, k16, v16, ours, backend.build_metadata(inputs))
    assert out.dtype == torch.bfloat16
    expected = reference(inputs, cache16.float(), q16.float(), k16.float(), v16.float())
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)  # bf16 output rounding
    assert torch.equal(ours, write_kv_by_hand(cache16, k16, v16, inputs.slot_mapping))


def test_without_kernels_the_cache_is_fp32(monkeypatch):
    monkeypatch.setenv("FORMWORK_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_kernels, "_state", {})
    backend = CpuAttentionBackend()
    assert backend.kernels is None
    assert backend.kv_cache_dtype(torch.bfloat16) == torch.float32


def _paged_attention_in_torch(out, q, k, v, kv_cache, slot_mapping, query_ids, block_table, seq_lens, scale,
                              sliding_window, softcap, honour_options=True):
    """The kernel's contract with its two layer options, in torch (one head, as the probe uses)."""
    write_kv(kv_cache, k, v, slot_mapping)
    block_size = kv_cache.shape[2]
    for i, t in enumerate(query_ids.tolist()):
        seq_len = int(seq_lens[i])
        first = max(0, seq_len - sliding_window) if sliding_window and honour_options else 0
        slots = [int(block_table[i, p // block_size]) * block_size + p % block_size for p in range(first, seq_len)]
        keys, values = kv_cache[0].view(-1, *k.shape[1:])[slots, 0], kv_cache[1].view(-1, *v.shape[1:])[slots, 0]
        scores = keys @ q[t, 0] * scale
        if softcap and honour_options:
            scores = torch.tanh(scores / softcap) * softcap
        out[t, 0] = scores.softmax(0) @ values


def test_the_kernel_probe_tells_which_kernels_take_windows_and_softcaps():
    from types import SimpleNamespace

    from engine.attention.cpu import kernel_takes_window_and_softcap
    assert kernel_takes_window_and_softcap(SimpleNamespace(paged_attention=_paged_attention_in_torch))
    ignores = SimpleNamespace(paged_attention=lambda *args: _paged_attention_in_torch(*args, honour_options=False))
    assert not kernel_takes_window_and_softcap(ignores)
    older = SimpleNamespace(paged_attention=lambda out, q, k, v, cache, slots, ids, table, lens, scale: None)
    assert not kernel_takes_window_and_softcap(older)


def _attend_schedule(backend, tokens, schedule, options, block_size=16):
    """Runs `schedule` (steps, each a list of (request, start, end): tokens [start, end) of that request,
    the ones before already in the cache) over a fresh cache and returns every request's output rows by
    position. tokens: request -> (q, k, v) of all its positions; each request owns scattered blocks."""
    _, first_k, _ = next(iter(tokens.values()))
    num_kv_heads, head_dim, dtype = first_k.shape[1], first_k.shape[2], first_k.dtype
    gen = torch.Generator().manual_seed(3)
    free = torch.randperm(64, generator=gen).tolist()
    blocks = {r: [free.pop() for _ in range(-(-len(q) // block_size))] for r, (q, _, _) in tokens.items()}
    max_blocks = max(len(b) for b in blocks.values())
    cache = torch.zeros(2, 64, block_size, num_kv_heads, head_dim, dtype=dtype)
    outputs = {r: {} for r in tokens}
    for step in schedule:
        qsl = np.cumsum([0] + [end - start for _, start, end in step]).astype(np.int32)
        table = torch.zeros(len(step), max_blocks, dtype=torch.int32)
        slots = []
        for row, (r, start, end) in enumerate(step):
            table[row, :len(blocks[r])] = torch.tensor(blocks[r], dtype=torch.int32)
            slots += [blocks[r][p // block_size] * block_size + p % block_size for p in range(start, end)]
        inputs = AttentionInputs(torch.tensor(slots, dtype=torch.int64), qsl,
                                 np.array([start for _, start, _ in step], dtype=np.int32),
                                 np.array([end for _, _, end in step], dtype=np.int32), table, block_size)
        q, k, v = (torch.cat([tokens[r][i][start:end] for r, start, end in step]) for i in range(3))
        out = backend.forward(q, k, v, cache, backend.build_metadata(inputs), options)
        for row, (r, start, end) in enumerate(step):
            for p in range(start, end):
                outputs[r][p] = out[int(qsl[row]) + p - start]
    return outputs


@pytest.mark.parametrize("dtype,head_dim,group", [(torch.bfloat16, 64, 3), (torch.bfloat16, 96, 2),
                                                  (torch.float32, 64, 3)])
@pytest.mark.parametrize("sliding_window,softcap", [(0, 0.0), (20, 30.0)])
def test_a_query_does_not_depend_on_how_its_prompt_is_split_or_batched(kernels, dtype, head_dim, group,
                                                                      sliding_window, softcap):
    """Bit for bit: each position of a 70-token prompt attended in one prefill, in chunks, token by
    token, as the one new row after a cached prefix, and beside another request's prompt and decodes
    (the engine's greedy answers depend on it: a prompt answered from the prefix cache must give
    the text the same prompt gives prefilled)."""
    gen = torch.Generator().manual_seed(head_dim + group)
    kv_heads = 2

    def request(length):
        q = torch.randn(length, group * kv_heads, head_dim, generator=gen) * 3  # peaked softmax
        return (q.to(dtype), torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype),
                torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype))

    tokens = {"a": request(70), "b": request(45)}
    backend = CpuAttentionBackend()
    options = AttentionOptions(sliding_window=sliding_window, softcap=softcap)
    prefilled = _attend_schedule(backend, tokens, [[("a", 0, 70)]], options)["a"]
    schedules = {
        "chunks": [[("a", 0, 23)], [("a", 23, 50)], [("a", 50, 70)]],
        "token by token": [[("a", t, t + 1)] for t in range(70)],
        "one new row after a cached prefix": [[("a", 0, 69)], [("a", 69, 70)]],
        "beside another request": [[("b", 0, 44), ("a", 0, 40)], [("a", 40, 70), ("b", 44, 45)]],
    }
    for name, schedule in schedules.items():
        got = _attend_schedule(backend, tokens, schedule, options)["a"]
        for p in range(70):
            assert torch.equal(got[p], prefilled[p]), f"{name}: position {p} differs"
    expected = paged_reference(tokens["a"][0][69:], _attend_cache(tokens["a"]), torch.arange(5)[None].int(),
                               torch.tensor([70], dtype=torch.int32), sliding_window, softcap)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # and still right
    torch.testing.assert_close(prefilled[69].double(), expected[0], atol=tolerance, rtol=tolerance)


def _attend_cache(qkv, block_size=16):
    """A cache holding one request's K/V in blocks 0, 1, 2... (for the float64 reference)."""
    _, k, v = qkv
    num_blocks = -(-len(k) // block_size)
    cache = torch.zeros(2, num_blocks * block_size, *k.shape[1:], dtype=k.dtype)
    cache[0, :len(k)], cache[1, :len(v)] = k, v
    return cache.view(2, num_blocks, block_size, *k.shape[1:])
