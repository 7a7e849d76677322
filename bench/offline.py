"""`formwork bench offline`: Formwork vs transformers' batched generate on the same prompts.

Both run greedy with EOS ignored so that both produce exactly num_prompts * max_tokens tokens. Beside
them: the decode step's curve over batch size and the prefill rate of long prompts (prompt tokens/s,
cold prefix cache, one output token), each against the peak of the matmul path that ran
(bench.roofline.matmul_peak).
"""
from __future__ import annotations

import time

import torch

from bench.roofline import matmul_peak, measure_bandwidth_gbs


def run_formwork(llm, prompts, max_tokens: int) -> tuple[float, int]:
    from engine.sampling_params import SamplingParams
    # no drafts: a story repeated to fill max_tokens would be drafted as no real answer is
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, speculative=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(o.num_output_tokens for o in outputs)


DECODE_BATCH_SIZES = (1, 8, 16, 32, 64, 128)


def decode_step_times(llm, batch_sizes: tuple[int, ...] = DECODE_BATCH_SIZES, max_tokens: int = 32) -> dict[int, float]:
    """Fastest engine step (launch -> outputs) with exactly B requests decoding one token each, of the
    max_tokens - 1 such steps: the machine is shared, and interference only ever adds time (batch
    sizes above the scheduler's max_num_seqs are left out)."""
    from engine.sampling_params import SamplingParams
    engine = llm.engine
    story = "Tell me a long story about a lighthouse keeper, a storm and a lost ship. " * 8  # ~130 tokens
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, speculative=False)
    times = {}
    for b in (b for b in batch_sizes if b <= engine.config.scheduler.max_num_seqs):
        prompts = [{"prompt_token_ids": llm.tokenizer.encode(f"{i}: {story}")} for i in range(b)]
        engine.step_stats.take_timings()  # the steps before this call
        llm.generate(prompts, params)
        steps = [t.total_s for t in engine.step_stats.take_timings() if t.num_reqs == b and t.num_tokens == b]
        times[b] = min(steps)
    return times


def prefill_rate(llm, num_prompts: int, prompt_tokens: int, repeats: int = 2) -> float:
    """Prompt tokens/s over num_prompts distinct prompts of prompt_tokens tokens each, one output
    token each, from an empty prefix cache: the best of `repeats` runs (the machine is shared)."""
    from engine.sampling_params import SamplingParams
    story = "The lighthouse keeper wrote down the storm, the lost ship and every light along the coast. "
    text = story * (prompt_tokens // 12 + 8)
    # a different first token each: no two prompts share a cached block
    prompts = [{"prompt_token_ids": llm.tokenizer.encode(f"{i}: {text}")[:prompt_tokens]} for i in range(num_prompts)]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, speculative=False)
    best = float("inf")
    for _ in range(repeats):
        llm.engine.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate(prompts, params)
        best = min(best, time.perf_counter() - start)
    return num_prompts * prompt_tokens / best


def matmul_flops_per_token(model, with_head: bool = True) -> int:
    """2 x the multiply-adds of every matmul one token goes through: the decoder's linears and (with_head)
    the head, which a prompt's tokens but its last skip."""
    from torch import nn

    from engine.kernels.cpu_linear import PackedLinear
    from engine.kernels.quantized_linear import QuantizedLinear
    linears = sum(m.in_features * m.out_features for m in model.layers.modules()
                  if isinstance(m, (nn.Linear, PackedLinear, QuantizedLinear)))
    return 2 * (linears + with_head * model.config.vocab_size * model.config.hidden_size)


def run_transformers(model_dir, tokenizer, prompts, max_tokens: int, batch_size: int,
                     dtype: str = "float32") -> tuple[float, int]:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    texts = [tokenizer.apply_chat_template(p) for p in prompts]
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    total_tokens = 0
    start = time.perf_counter()
    for i in range(0, len(texts), batch_size):
        batch = hf_tok(texts[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=hf_tok.pad_token_id)
        total_tokens += (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
    return time.perf_counter() - start, total_tokens


def compare_unquantized(engine_config, quantized_times: dict[int, float], bandwidth: float) -> None:
    """The same decode curve without --quantization, in this run, beside the quantized one."""
    from dataclasses import replace

    from engine.llm import LLM
    llm = LLM(config=replace(engine_config, quantization=None, quantize_lm_head=False))
    run_formwork(llm, [[{"role": "user", "content": "Hello"}]], 4)  # warm-up
    plain_times = decode_step_times(llm, tuple(quantized_times))
    weight_bytes = llm.engine.runner.model.weight_bytes()
    llm.shutdown()
    print(f"unquantized ({engine_config.torch_dtype}; weight-read floor "
          f"{weight_bytes / (bandwidth * 1e9) * 1e3:.1f} ms = {weight_bytes / 2**20:.0f} MiB), same run:")
    for b, step_s in plain_times.items():
        print(f"  batch {b:>3}: {step_s * 1e3:6.1f} ms  {b / step_s:6.1f} tok/s  "
              f"{engine_config.quantization} is {step_s / quantized_times[b]:4.2f}x as fast")


def main(args, engine_config) -> int:
    from bench.prompts import chat_prompts
    from engine.llm import LLM

    prompts = chat_prompts(args.num_prompts)
    llm = LLM(config=engine_config)
    print(f"model {llm.engine.model_name}, {args.num_prompts} prompts x {args.max_tokens} tokens, "
          f"torch threads {torch.get_num_threads()}")
    run_formwork(llm, prompts[:2], 4)  # warm-up
    fw_s, fw_tokens = run_formwork(llm, prompts, args.max_tokens)
    print(f"formwork:     {fw_tokens} tokens in {fw_s:.1f} s = {fw_tokens / fw_s:.1f} tok/s")
    step_times = decode_step_times(llm)
    prefill = prefill_rate(llm, args.prefill_prompts, args.prefill_tokens)
    model = llm.engine.runner.model
    weight_bytes, resident_bytes, flops_per_token = model.weight_bytes(), model.resident_weight_bytes(), \
        matmul_flops_per_token(model)
    peak, path = matmul_peak(model)
    llm.shutdown()
    bandwidth = measure_bandwidth_gbs()
    floor_s = weight_bytes / (bandwidth * 1e9)
    threads = torch.get_num_threads()
    print(f"decode step ({engine_config.dtype_choice}; weight-read floor {floor_s * 1e3:.1f} ms = "
          f"{weight_bytes / 2**20:.0f} MiB / {bandwidth:.1f} GB/s):")
    print(f"  resident weights {resident_bytes / 2**20:.0f} MiB = {resident_bytes / weight_bytes:.2f}x their bytes; "
          f"matmuls {flops_per_token / 1e6:.0f} MFLOP a token; peak {peak:.0f} GFLOP/s: {path}, {threads} threads")
    for b, step_s in step_times.items():
        gflops = b * flops_per_token / step_s / 1e9
        print(f"  batch {b:>3}: {step_s * 1e3:6.1f} ms  {b / step_s:6.1f} tok/s  {step_s / floor_s:5.2f}x the floor  "
              f"{gflops:6.1f} GFLOP/s  {100 * gflops / peak:5.1f}% of the peak")
    prefill_gflops = prefill * matmul_flops_per_token(model, with_head=False) / 1e9
    print(f"prefill: {args.prefill_prompts} prompts x {args.prefill_tokens} tokens, cold prefix cache, 1 output token: "
          f"{prefill:.1f} prompt tok/s, matmuls {prefill_gflops:.1f} GFLOP/s = {100 * prefill_gflops / peak:.1f}% "
          f"of the peak (attention not counted)")
    if engine_config.quantization is not None:
        compare_unquantized(engine_config, step_times, bandwidth)
    if args.skip_transformers:
        return 0
    hf_s, hf_tokens = run_transformers(llm.engine.model_dir, llm.tokenizer, prompts, args.max_tokens,
                                       args.hf_batch_size, engine_config.torch_dtype)
    print(f"transformers: {hf_tokens} tokens in {hf_s:.1f} s = {hf_tokens / hf_s:.1f} tok/s "
          f"(generate, batch {args.hf_batch_size}, {engine_config.torch_dtype})")
    print(f"ratio formwork / transformers: {(fw_tokens / fw_s) / (hf_tokens / hf_s):.2f}x")
    return 0
