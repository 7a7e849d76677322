"""`python -m bench.forward_split`: where a decode step's (or a prompt's) forward goes, op by op.

--batch B requests decode --steps tokens each after ~130-token prompts (their prefill not counted);
the linears (by shape), the paged attention, the fused elementwise ops and the rest of the forward
are timed in the engine, in ms a step, with the linears' GFLOP/s against the inner-loop peak of the
path they take (bench.roofline.matmul_peak), measured in the same process. --prompt-tokens N times
instead one N-token prompt's prefill (one output token, cold prefix cache, in chunks of the
scheduler's token budget), the fastest of --repeats; the rows each linear saw show that the head
reads only the last row. Layers that run as one kernel call (`DecoderLayer.use_fused_kernels`) are
split back into their ops for the timing: the same kernels, so the split adds up to a step of the
unfused path; the fused step's median (or prefill) is printed beside it. Set
OMP_WAIT_POLICY=PASSIVE as the engine runs.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time


def _timed(owner, name: str, key, totals: dict, active: list[bool], flops=None, flop_totals=None,
           rows=None) -> None:
    """Wraps owner.name so that, while active[0], its wall time adds to totals[key(args)] (and
    flops(args) to flop_totals[key(args)], the rows of its input args[1] to rows[key(args)])."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if not active[0]:
            return inner(*args, **kwargs)
        start = time.perf_counter()
        result = inner(*args, **kwargs)
        totals[key(args)] += time.perf_counter() - start
        if flops is not None:
            flop_totals[key(args)] += flops(args)
        if rows is not None:
            rows[key(args)] += args[1].shape[0]
        return result

    setattr(owner, name, wrapper)


def _decode_step_ms(llm, prompts, steps: int) -> float:
    """Median engine step (ms) with every request decoding one token."""
    from engine.sampling_params import SamplingParams
    engine = llm.engine
    engine.step_stats.take_timings()  # the steps before this call
    llm.generate(prompts, SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True, speculative=False))
    timings = engine.step_stats.take_timings()
    return 1e3 * statistics.median(t.total_s for t in timings if t.num_tokens == t.num_reqs == len(prompts))


def _prefill_s(llm, prompt, repeats: int) -> float:
    """The fastest of `repeats` prefills of one prompt from an empty prefix cache (one output token)."""
    from engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, speculative=False)
    best = float("inf")
    for _ in range(repeats):
        llm.engine.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate([prompt], params)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=0, help="time one prompt's prefill of this many tokens")
    parser.add_argument("--repeats", type=int, default=3, help="prefills timed (--prompt-tokens): the fastest counts")
    args = parser.parse_args()

    from bench.roofline import matmul_peak
    from engine.attention.cpu import CpuAttentionBackend
    from engine.config import EngineConfig, SchedulerConfig
    from engine.kernels import decoder_ops
    from engine.kernels.cpu_linear import PackedLinear
    from engine.llm import LLM

    totals: dict[str, float] = collections.defaultdict(float)
    flops: dict[str, float] = collections.defaultdict(float)
    rows: dict[str, int] = collections.defaultdict(int)
    active = [False]
    _timed(PackedLinear, "forward", lambda a: f"linear {a[0].out_features}x{a[0].in_features}", totals, active,
           lambda a: 2.0 * a[1].shape[0] * a[0].in_features * a[0].out_features, flops, rows)
    _timed(CpuAttentionBackend, "forward", lambda a: "paged attention", totals, active)
    for op in ("add_rms_norm", "silu_and_mul", "rotary_"):
        _timed(decoder_ops, op, lambda a, op=op: op, totals, active)

    llm = LLM(config=EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max(args.batch, 1))))
    story = "Tell me a long story about a lighthouse keeper, a storm and a lost ship. " * 8  # ~130 tokens
    prompts = [{"prompt_token_ids": llm.tokenizer.encode(f"{i}: {story}")} for i in range(args.batch)]
    if args.prompt_tokens:
        ids = llm.tokenizer.encode(story * (args.prompt_tokens // 100 + 1))[:args.prompt_tokens]
        prompts = [{"prompt_token_ids": ids}]
        _prefill_s(llm, prompts[0], 1)  # warm-up
        fused_ms = 1e3 * _prefill_s(llm, prompts[0], args.repeats)
    else:
        fused_ms = _decode_step_ms(llm, prompts, args.steps)  # also caches the prompts
    model = llm.engine.runner.model
    fused = [layer.fused_kernels for layer in model.layers]
    for layer in model.layers:
        layer.fused_kernels = None
    forward = type(model).forward
    forward_s, num_forwards = [0.0], [0]

    def timed_forward(self, input_ids, *a, **kw):
        # decode steps only, not the prompts' last rows (with --prompt-tokens: every chunk)
        active[0] = bool(args.prompt_tokens) or input_ids.shape[0] == args.batch
        start = time.perf_counter()
        result = forward(self, input_ids, *a, **kw)
        if active[0]:
            forward_s[0] += time.perf_counter() - start
            num_forwards[0] += 1
        active[0] = False
        return result

    type(model).forward = timed_forward
    if args.prompt_tokens:  # the fastest prefill's split: totals as they stand after it
        best = (float("inf"),)
        for _ in range(args.repeats):
            for d in (totals, flops, rows):
                d.clear()
            forward_s[0], num_forwards[0] = 0.0, 0
            seconds = _prefill_s(llm, prompts[0], 1)
            if seconds < best[0]:
                best = (seconds, dict(totals), dict(flops), dict(rows), forward_s[0], num_forwards[0])
        seconds, totals, flops, rows, forward_s[0], num_forwards[0] = best
        step_ms = 1e3 * seconds
    else:
        step_ms = _decode_step_ms(llm, prompts, args.steps)
    type(model).forward = forward
    for layer, kernels in zip(model.layers, fused):
        layer.fused_kernels = kernels
    peak, peak_path = matmul_peak(model)  # of the path this model's linears take
    llm.shutdown()

    if args.prompt_tokens:
        n = 1
        print(f"prefill of {args.prompt_tokens} tokens in {num_forwards[0]} forwards, fastest of {args.repeats}: "
              f"{step_ms:.0f} ms op by op ({args.prompt_tokens / step_ms * 1e3:.1f} tok/s), {fused_ms:.0f} ms with "
              f"the fused layers ({args.prompt_tokens / fused_ms * 1e3:.1f} tok/s); forward {1e3 * forward_s[0]:.0f} ms; "
              f"peak {peak:.0f} GFLOP/s ({peak_path})")
    else:
        n = max(1, num_forwards[0])
        print(f"batch {args.batch}: decode step median {step_ms:.1f} ms op by op, {fused_ms:.1f} ms with the fused "
              f"layers ({sum(k is not None for k in fused)} of {len(fused)}); forward {1e3 * forward_s[0] / n:.1f} ms "
              f"a step over {n}; peak {peak:.0f} GFLOP/s ({peak_path})")
    linear_s = sum(v for k, v in totals.items() if k.startswith("linear"))
    for key, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        rate = f"  {flops[key] / seconds / 1e9:6.1f} GFLOP/s, {rows[key]} rows" if key in flops else ""
        print(f"  {key:22s} {1e3 * seconds / n:7.2f} ms {100 * seconds / n / step_ms * 1e3:5.1f} %{rate}")
    print(f"  {'rest of the forward':22s} {1e3 * (forward_s[0] - sum(totals.values())) / n:7.2f} ms")
    if linear_s and peak:
        rate = sum(flops.values()) / linear_s / 1e9
        print(f"  linears {1e3 * linear_s / n:.1f} ms: {rate:.1f} GFLOP/s = {100 * rate / peak:.1f} % of the peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
