"""The benchmark half of `make gpu-check`: decode speed on a CUDA device, written as one JSON file.

    python -m bench.gpu_check --model DIR --out gpu_check.json [--pytest-xml pytest.xml]
    python -m bench.gpu_check --model DIR --out x.json --device cpu --quick   # dry run of the code paths

Figures, all bf16 (float32 on the CPU), greedy, EOS ignored:

* decode tok/s at batch 1, 32 and 128: full-batch decode steps only (median step time), CUDA
  graphs on, and the same with graphs off (eager) for the speed-up;
* the step time at batch 1 against the HBM floor (all weights read once per step, at the
  bandwidth of a device-to-device copy measured here), and the GPU time of one graph replay
  (CUDA events), which shows how much of the step is host work;
* structured / unconstrained tok/s at batch 32 (a JSON schema that keeps every request busy for
  all max_tokens steps), with jump-forward off (the pure cost of masks) and on;
* bf16 batch invariance, measured: lone vs batched greedy outputs (tests/engine/test_gpu.py explains why
  bf16 is measured rather than asserted).

With --pytest-xml the GPU tests' junit summary is folded into the same JSON.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
import traceback
import xml.etree.ElementTree as ET

import torch

from bench.prompts import chat_prompts

LONG_SCHEMA = {  # every request stays constrained for all max_tokens steps (128 tokens end mid-array)
    "type": "object",
    "properties": {"items": {"type": "array", "minItems": 40, "maxItems": 40, "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16}, "ok": {"type": "boolean"},
                       "n": {"type": "integer", "minimum": 0, "maximum": 999},
                       "kind": {"enum": ["alpha", "beta", "gamma"]}},
        "required": ["name", "ok", "n", "kind"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False,
}


def measure_copy_bandwidth_gbs(device: torch.device, num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (median of 10)."""
    if device.type != "cuda":
        return float("nan")
    src = torch.randn(num_bytes // 4, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * num_bytes / statistics.median(times[2:]) / 1e9


def make_llm(args):
    from engine.config import CacheConfig, CudaConfig, EngineConfig, SchedulerConfig
    from engine.llm import LLM
    from grammar.config import GrammarConfig
    cuda = args.device == "cuda"
    return LLM(config=EngineConfig(
        model=args.model, device=args.device, dtype="bfloat16" if cuda else "float32",
        max_model_len=args.max_model_len,
        scheduler=SchedulerConfig(max_num_seqs=max(args.batch_sizes), max_num_batched_tokens=args.budget),
        cache=CacheConfig(num_blocks=None if cuda else 2048),
        grammar=GrammarConfig(),
        cuda=CudaConfig(gpu_memory_utilization=args.gpu_memory_utilization)))


def timed_generate(llm, prompts, params) -> tuple[list, list, float]:
    """Outputs, step timings and wall seconds of one generate call."""
    llm.engine.step_stats.take_timings()  # the steps before this call
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return outputs, llm.engine.step_stats.take_timings(), seconds


def decode_figures(timings, batch_size: int, outputs, seconds: float) -> dict:
    """Median full-batch decode step -> tok/s; plus wall tok/s including prefill."""
    full = [t for t in timings if t.num_reqs == batch_size and t.num_tokens == batch_size]
    step = statistics.median(t.total_s for t in full) if full else float("nan")
    med = lambda xs: 1e3 * statistics.median(xs) if xs else float("nan")  # noqa: E731
    return {"batch": batch_size, "decode_steps": len(full), "step_ms": 1e3 * step,
            "decode_tok_s": batch_size / step if full else float("nan"),
            "wall_tok_s": sum(o.num_output_tokens for o in outputs) / seconds,
            "launch_ms": med([t.forward_s for t in full]), "fill_ms": med([t.fill_s for t in full]),
            "wait_ms": med([t.wait_s for t in full]), "sample_ms": med([t.sample_s for t in full])}


def decode_run(llm, batch_size: int, max_tokens: int, constraint=None) -> dict:
    from engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, constraint=constraint)
    outputs, timings, seconds = timed_generate(llm, chat_prompts(batch_size), params)
    figures = decode_figures(timings, batch_size, outputs, seconds)
    figures["output_tokens"] = sum(o.num_output_tokens for o in outputs)
    return figures


def replay_gpu_ms(llm, batch_size: int, context_len: int) -> float:
    """GPU time of one decode graph replay (CUDA events over 50), all rows padding."""
    graphs = llm.engine.runner.decode_graphs
    if graphs is None:
        return float("nan")
    num_blocks = next(c for c in graphs.block_counts if c * graphs.block_size >= context_len)
    graphs.capture_all(num_blocks)  # also resets every static row to padding: replays write slot 0 only
    graph = graphs._graphs[(graphs.padded_batch_size(batch_size), num_blocks)].graph
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 50


def batch_invariance(llm, num_prompts: int, max_tokens: int) -> dict:
    from engine.sampling_params import SamplingParams
    prompts = chat_prompts(num_prompts)
    params = [SamplingParams(max_tokens=max(2, max_tokens - 2 * i), temperature=0, ignore_eos=True)
              for i in range(num_prompts)]  # staggered: the batch shrinks as requests finish
    alone = [llm.generate([p], q)[0].token_ids for p, q in zip(prompts, params)]
    batched = [o.token_ids for o in llm.generate(prompts, params)]
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) / len(x) for x, y in zip(alone, batched)]
    return {"sequences": num_prompts, "identical": sum(a == b for a, b in zip(alone, batched)),
            "mean_common_prefix": statistics.mean(prefix)}


def pytest_summary(path: str) -> dict:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")} | \
        {"time_s": float(suite.get("time", 0)), "failed": failed}


def machine(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "multiprocessors": props.multi_processor_count}
    try:
        import flash_attn  # noqa: F401  (only to report it: engine/attention/flash.py is the one user)
        info["flash_attn"] = getattr(flash_attn, "__version__", "installed")
    except ImportError:
        info["flash_attn"] = None
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description="GPU check benchmark")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a dry run of the code paths")
    parser.add_argument("--pytest-xml", default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-model-len", type=int, default=None)
    args = parser.parse_args()
    args.batch_sizes = [1, 4] if args.quick else [1, 32, 128]
    args.budget = 8192
    max_tokens = 8 if args.quick else 128
    structured_batch = args.batch_sizes[-1] if args.quick else 32
    device = torch.device(args.device)
    result: dict = {"machine": machine(device), "model": args.model, "dtype": "bfloat16" if args.device == "cuda"
                    else "float32", "max_tokens": max_tokens, "errors": {}}
    if args.pytest_xml:
        try:
            result["pytest"] = pytest_summary(args.pytest_xml)
        except (OSError, ET.ParseError) as e:
            result["pytest"] = {"error": str(e)}

    def stage(name: str, fn) -> None:
        """Run one part; a failure is recorded and the next part still runs (one lease, one try)."""
        try:
            result[name] = fn()
        except Exception:  # noqa: BLE001 - reported in the JSON and the log, never hidden
            result["errors"][name] = traceback.format_exc()
            print(f"gpu_check: {name} failed\n{result['errors'][name]}", flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)

    stage("copy_bandwidth_gbs", lambda: measure_copy_bandwidth_gbs(device))
    start = time.perf_counter()
    llm = make_llm(args)
    runner = llm.engine.runner
    weight_bytes = runner.model.weight_bytes()

    def engine_info() -> dict:
        info = {"init_s": time.perf_counter() - start, "attention_backend": type(runner.attn_backend).__name__,
                "num_kv_blocks": runner.num_blocks,
                "kv_cache_gib": sum(t.numel() * t.element_size() for t in runner.kv_caches) / 2**30,
                "weight_bytes": weight_bytes, "cuda_graphs": runner.decode_graphs is not None}
        llm.generate(chat_prompts(2), None)  # warm-up: kernels, grammar tokenizer info
        if runner.decode_graphs is not None:
            started = time.perf_counter()
            info["graphs_captured"] = runner.decode_graphs.capture_all(-(-(200 + max_tokens) // runner.block_size))
            info["capture_s"] = time.perf_counter() - started
        return info

    stage("engine", engine_info)
    stage("decode", lambda: [decode_run(llm, b, max_tokens) for b in args.batch_sizes])

    def eager() -> list[dict]:
        graphs, runner.decode_graphs = runner.decode_graphs, None  # the same engine, without graphs
        try:
            return [decode_run(llm, b, max_tokens // 2) for b in args.batch_sizes[:2]]
        finally:
            runner.decode_graphs = graphs

    stage("decode_eager", eager)

    def floor() -> dict:
        bandwidth = result.get("copy_bandwidth_gbs", float("nan"))
        floor_s = weight_bytes / (bandwidth * 1e9)
        step_s = result["decode"][0]["step_ms"] / 1e3
        replay_ms = replay_gpu_ms(llm, 1, 100)
        return {"weight_bytes": weight_bytes, "weight_read_floor_us": floor_s * 1e6,
                "batch1_step_us": step_s * 1e6, "batch1_step_over_floor": step_s / floor_s,
                "batch1_graph_replay_gpu_us": replay_ms * 1e3, "batch1_graph_replay_over_floor": replay_ms / 1e3 / floor_s}

    stage("floor", floor)

    def structured() -> dict:
        from grammar.constraint import Constraint
        spec = json.dumps(LONG_SCHEMA)
        base = decode_run(llm, structured_batch, max_tokens)
        out = {"batch": structured_batch, "unconstrained": base}
        # jump-forward is a per-request switch: off for the cost of masks alone, then on
        out["constrained"] = decode_run(llm, structured_batch, max_tokens,
                                        Constraint(kind="json_schema", spec=spec, jump_forward=False))
        out["constrained_jump_forward"] = decode_run(llm, structured_batch, max_tokens,
                                                     Constraint(kind="json_schema", spec=spec, jump_forward=True))
        out["ratio_decode_tok_s"] = out["constrained"]["decode_tok_s"] / base["decode_tok_s"]
        out["ratio_wall_tok_s"] = out["constrained"]["wall_tok_s"] / base["wall_tok_s"]
        out["ratio_wall_tok_s_jump_forward"] = out["constrained_jump_forward"]["wall_tok_s"] / base["wall_tok_s"]
        return out

    stage("structured", structured)
    stage("bf16_batch_invariance", lambda: batch_invariance(llm, 8 if args.quick else 16, max_tokens // 2))
    llm.shutdown()
    del llm, runner
    gc.collect()
    print_summary(result)
    return 1 if result["errors"] else 0


def print_summary(r: dict) -> None:
    m, e = r["machine"], r.get("engine", {})
    print(f"machine: {m.get('gpu', 'cpu')}, torch {m['torch']}, flash-attn {m['flash_attn']}, "
          f"backend {e.get('attention_backend')}, KV {e.get('kv_cache_gib', 0):.1f} GiB "
          f"({e.get('num_kv_blocks')} blocks), copy {r.get('copy_bandwidth_gbs', float('nan')):.0f} GB/s")
    for d in r.get("decode", []):
        print(f"decode batch {d['batch']:>3}: {d['decode_tok_s']:9.0f} tok/s, step {d['step_ms']:.2f} ms "
              f"(launch {d['launch_ms']:.2f}, wait {d['wait_ms']:.2f}, sample {d['sample_ms']:.2f})")
    for d in r.get("decode_eager", []):
        print(f"eager  batch {d['batch']:>3}: {d['decode_tok_s']:9.0f} tok/s, step {d['step_ms']:.2f} ms")
    if "floor" in r:
        f = r["floor"]
        print(f"batch-1 step {f['batch1_step_us']:.0f} us = {f['batch1_step_over_floor']:.1f}x the weight-read floor "
              f"{f['weight_read_floor_us']:.0f} us; graph replay on the GPU {f['batch1_graph_replay_gpu_us']:.0f} us")
    if "structured" in r:
        s = r["structured"]
        print(f"structured/unconstrained at batch {s['batch']}: decode {s['ratio_decode_tok_s']:.3f}, "
              f"wall {s['ratio_wall_tok_s']:.3f} (jump-forward {s['ratio_wall_tok_s_jump_forward']:.3f})")
    if "bf16_batch_invariance" in r:
        b = r["bf16_batch_invariance"]
        print(f"batch invariance: {b['identical']}/{b['sequences']} identical, mean common prefix "
              f"{b['mean_common_prefix']:.2f}")
    if "pytest" in r:
        print(f"pytest: {r['pytest']}")
    if r["errors"]:
        print(f"errors in: {', '.join(r['errors'])}")


if __name__ == "__main__":
    raise SystemExit(main())
