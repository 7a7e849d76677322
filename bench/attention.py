"""`python -m bench.attention`: the paged-attention kernel alone, on a prompt's rows and on decodes.

A prompt of --prompt-lengths tokens is prefilled in chunks of --budget queries (one call each, its
earlier chunks in the cache), and --decode-batches requests of --context tokens each decode one
query; shapes: the default model's (9 query heads over 3 kv heads of 64) and the 1.5B model's (12
over 2, of 128). For each, the best of --repeats timings (the machine is shared: interference only
adds time) in ms a layer and GFLOP/s (2 D FLOPs per key and query head for q.k, 2 D for p.v).
--layers N gives every layer its own cache (N of them, called in turn, as the engine's layers are):
with N = 30 a batch of decodes reads its K/V from memory, not from the L3 cache one layer's fits in.
--shared-prefix T puts the decoding requests' first T tokens (whole blocks) in the same physical
blocks, as the prefix cache does for a common system prompt.
--dtype float32 gives q, K/V and outputs in fp32, as a CPU without AVX-512 BF16 runs them.
--threads sets torch's thread count first (the kernels' helpers are that many minus one): 1 shows
whether a case gains from the second core at all; with it, --cpu-time times the CPU of the calling thread
(which then does all of the kernel's work) instead of the wall clock: on a loaded machine the other
processes' turns on the core then add nothing. With --prefill N, also the engine's whole
prefill of an N-token prompt (bf16, default model, prefix cache off, best of --repeats) beside 30
layers of the kernel on the same chunks: attention's share.
Set OMP_WAIT_POLICY=PASSIVE as the engine runs.
"""
from __future__ import annotations

import argparse
import time

import torch

SHAPES = {"135m": (9, 3, 64), "1.5b": (12, 2, 128)}  # name -> (query heads, kv heads, head_dim)
BLOCK_SIZE = 16


def best_seconds(fn, repeats: int, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def paged_calls(kernels, heads: int, kv_heads: int, head_dim: int, requests: list[tuple[int, int]], budget: int,
                shared_blocks: int = 0, seed: int = 0, dtype: torch.dtype = torch.bfloat16):
    """The calls (closures) of one layer's steps attending `requests` (cached tokens, new tokens) in
    steps of at most `budget` queries, over a `dtype` cache where each request owns scattered blocks
    (but for its first `shared_blocks` before the one it writes, the same for all); and the FLOPs."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [c + n for c, n in requests]
    shared = [min(shared_blocks, (n - 1) // BLOCK_SIZE) for n in lengths]  # never the block a step writes
    own = [-(-n // BLOCK_SIZE) - s for n, s in zip(lengths, shared)]
    num_blocks = shared_blocks + sum(own) + 1
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=gen).to(dtype)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    prefix = [free.pop() for _ in range(shared_blocks)]
    rows = [prefix[:s] + [free.pop() for _ in range(m)] for s, m in zip(shared, own)]
    width = max(len(r) for r in rows)
    table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)
    calls, flops, queries = [], 0, []  # queries: (request, position) pending
    for i, (cached, new) in enumerate(requests):
        queries += [(i, p) for p in range(cached, cached + new)]
    for start in range(0, len(queries), budget):
        step = queries[start:start + budget]
        n = len(step)
        q = torch.randn(n, heads, head_dim, generator=gen).to(dtype)
        k = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
        slots = torch.tensor([int(table[r, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for r, p in step])
        block_table = table[torch.tensor([r for r, _ in step])].contiguous()
        seq_lens = torch.tensor([p + 1 for _, p in step], dtype=torch.int32)
        out = torch.empty(q.shape, dtype=dtype)
        args = (out, q, k, v, cache, slots, torch.arange(n), block_table, seq_lens, head_dim ** -0.5)
        calls.append(lambda args=args: kernels.paged_attention(*args))
        flops += int(seq_lens.sum()) * heads * 4 * head_dim
    return calls, flops


def prefill_seconds(num_tokens: int, budget: int, repeats: int) -> float:
    """The engine's time to prefill one num_tokens-token prompt and sample its first token."""
    from engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams
    llm = LLM(config=EngineConfig(dtype="bfloat16", scheduler=SchedulerConfig(max_num_batched_tokens=budget),
                                  cache=CacheConfig(enable_prefix_caching=False)))
    ids = llm.tokenizer.encode("Tell me about rivers, their sources, deltas and history. " * num_tokens)[:num_tokens]
    params = SamplingParams(max_tokens=1, temperature=0)
    llm.generate({"prompt_token_ids": ids}, params)  # warm-up
    seconds = best_seconds(lambda: llm.generate({"prompt_token_ids": ids}, params), repeats)
    llm.shutdown()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--prompt-lengths", default="700,2000")
    parser.add_argument("--budget", type=int, default=512, help="queries a step (the scheduler's token budget)")
    parser.add_argument("--decode-batches", default="1,64")
    parser.add_argument("--context", type=int, default=160, help="tokens of each decoding request")
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens the decoding requests share")
    parser.add_argument("--layers", type=int, default=1, help="caches, one a layer, called in turn")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=0, help="also time the engine's prefill of this many tokens")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="q, K/V, out")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--cpu-time", action="store_true", help="with --threads 1: this thread's CPU time")
    args = parser.parse_args()
    if args.layers < 1 or args.shared_prefix < 0:
        raise SystemExit(f"--layers: 1 or more, --shared-prefix: 0 or more, got {args.layers}, {args.shared_prefix}")
    if args.threads < 0:
        raise SystemExit(f"--threads: 0 (torch's default) or a positive count, got {args.threads}")
    if args.cpu_time and args.threads != 1:
        raise SystemExit("--cpu-time: only with --threads 1 (the calling thread then does all of the work)")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)  # before the kernels' pool is sized from it
    from engine.kernels.loader import load_cpu_kernels
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the CPU kernels did not build here")
    isa = getattr(kernels, "paged_attention_isa", lambda: "avx512_bf16")()  # older builds: the vector kernel
    dtype = getattr(torch, args.dtype)
    print(f"paged attention, {args.dtype} ({isa}), {torch.get_num_threads()} threads; {args.layers} layers' caches, "
          f"decodes sharing {args.shared_prefix // BLOCK_SIZE * BLOCK_SIZE} tokens; best of {args.repeats}")
    print(f"{'shape':>6} {'case':>22} {'ms a layer':>11} {'GFLOP/s':>8}")
    for name in args.shapes.split(","):
        heads, kv_heads, head_dim = SHAPES[name]
        cases = [(f"prompt {n} (budget {args.budget})", [(0, n)], args.budget, 0)
                 for n in (int(x) for x in args.prompt_lengths.split(","))]
        cases += [(f"decode {b} x {args.context}", [(args.context - 1, 1)] * b, b, args.shared_prefix // BLOCK_SIZE)
                  for b in (int(x) for x in args.decode_batches.split(","))]
        for case, requests, budget, shared in cases:
            layers = [paged_calls(kernels, heads, kv_heads, head_dim, requests, budget, shared, seed, dtype)
                      for seed in range(args.layers)]
            calls, flops = [c for layer_calls, _ in layers for c in layer_calls], layers[0][1]
            seconds = best_seconds(lambda: [call() for call in calls], args.repeats, clock) / args.layers
            print(f"{name:>6} {case:>22} {seconds * 1e3:11.2f} {flops / seconds / 1e9:8.1f}")
    if args.prefill:
        heads, kv_heads, head_dim = SHAPES["135m"]
        calls, _ = paged_calls(kernels, heads, kv_heads, head_dim, [(0, args.prefill)], args.budget)
        # on the wall clock, as the engine's prefill is
        attention = 30 * best_seconds(lambda: [call() for call in calls], args.repeats)
        total = prefill_seconds(args.prefill, args.budget, args.repeats)
        print(f"engine prefill of {args.prefill} tokens: {total * 1e3:.0f} ms ({args.prefill / total:.0f} tok/s); "
              f"the kernel's 30 layers alone: {attention * 1e3:.0f} ms ({100 * attention / total:.0f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
