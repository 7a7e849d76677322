"""The engine's command-line flags, shared by `formwork generate`, `serve` and `bench`."""
from __future__ import annotations

import argparse


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    from engine.config import HostMemoryConfig, SpeculativeConfig
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="local Hugging Face model folder, or a .gguf file (prepared once into the cache); "
                        "default: packaged SmolLM2-135M-Instruct")
    g.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=64, help="requests per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    g.add_argument("--num-blocks", type=int, default=None, help="KV cache blocks (default: from --kv-cache-gib on CPU, --gpu-memory-utilization on CUDA)")
    g.add_argument("--kv-cache-gib", type=float, default=1.0, help="CPU: KV cache memory when --num-blocks is unset")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--no-jump-forward", action="store_true", help="engine default for jump-forward decoding")
    g.add_argument("--no-close-early", action="store_true",
                   help="engine default for closing constrained outputs before max_tokens and on runaway loops")
    g.add_argument("--speculative-ngram", action=argparse.BooleanOptionalAction, default=SpeculativeConfig.enabled,
                   help="engine default for speculative decoding with drafts from the prompt and output "
                        "(a request may switch it off or on; default: on for CPU, off on CUDA)")
    g.add_argument("--num-speculative-tokens", type=int, default=SpeculativeConfig.num_speculative_tokens,
                   help="draft tokens per request and step, at most (default: %(default)s)")
    g.add_argument("--draft-by-text", action=argparse.BooleanOptionalAction, default=SpeculativeConfig.draft_by_text,
                   help="speculation also looks the output's last bytes up in the prompt's text, for copies "
                        "whose tokens differ from the prompt's (default: %(default)s)")
    g.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="weights and activations (auto: bfloat16 on CUDA and on CPUs with bf16 dot products)")
    g.add_argument("--quantization", choices=["int8", "int8:lenient"], default=None,
                   help="CPU: matmul weights in int8 with per-channel scales, activations quantized per token "
                        "(a Q8_0 GGUF is served from its own int8 blocks); int8:lenient serves layers the "
                        "int8 kernel cannot take unquantized instead of refusing the model (docs/models.md)")
    g.add_argument("--quantize-lm-head", action="store_true",
                   help="with --quantization: the lm_head (the logits' matmul) in int8 too")
    g.add_argument("--cpu-weight-dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="float32 on CPU: how the matmul weights are held (auto: bfloat16 with --dtype auto, "
                        "else float32, or bf16 where that loses nothing)")
    # CUDA options (a CPU engine ignores them)
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="CUDA: fraction of device memory for weights + KV cache + activations (KV takes the rest)")
    g.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs for decode steps")
    g.add_argument("--attention-backend", choices=["auto", "flash_attn", "torch"], default="auto",
                   help="CUDA: flash-attn if usable (auto), flash-attn or an error, or torch SDPA")
    from grammar.config import GRAMMAR_BACKENDS, GrammarConfig
    defaults = GrammarConfig()
    b = parser.add_argument_group("grammar bounds (a constraint past one is refused: docs/constraints.md)")
    b.add_argument("--grammar-backend", choices=list(GRAMMAR_BACKENDS), default=defaults.grammar_backend,
                   help="the library that compiles a constraint which names none: auto picks per constraint the "
                        "one that enforces every keyword and answers first, xgrammar or llguidance always that "
                        "one (docs/constraints.md) (default: %(default)s)")
    b.add_argument("--no-idle-compiles", action="store_true",
                   help="compile grammars at normal CPU priority, not in the idle class (rescued when starved) "
                        "that keeps a heavy compile from slowing running requests")
    b.add_argument("--no-schema-worker", action="store_true",
                   help="run the Python part of a large schema's compile (its rewrite, its grammar's bounds) in "
                        "the engine's process, not in the worker process that keeps it from holding the GIL "
                        "the running requests need")
    b.add_argument("--compile-timeout", type=float, default=defaults.compile_timeout_s,
                   help="seconds one grammar compile may take (default: %(default)s)")
    b.add_argument("--max-schema-depth", type=int, default=defaults.max_schema_depth,
                   help="JSON-schema nesting depth, in schema levels (default: %(default)s)")
    b.add_argument("--max-forced-bytes", type=int, default=defaults.max_forced_bytes,
                   help="forced text jump-forward takes per step, and the most output a grammar may need at "
                        "one point (default: %(default)s)")
    b.add_argument("--max-repeat-count", type=int, default=defaults.max_repeat_count,
                   help="largest count of a regex quantifier {m,n} (default: %(default)s)")
    b.add_argument("--max-fill-ms", type=float, default=defaults.max_fill_ms,
                   help="CPU milliseconds one request's bitmask fill may take (default: %(default)s)")
    b.add_argument("--lazy-fill-budget-ms", type=float, default=defaults.lazy_fill_budget_ms,
                   help="CPU milliseconds a grammar that builds its token masks on first use may spend in "
                        "fills over --max-fill-ms in one request (default: %(default)s)")
    memory = HostMemoryConfig()
    h = parser.add_argument_group("host memory (the engine's heap: docs/reliability.md, \"Soak\")")
    h.add_argument("--malloc-mmap-threshold", type=int, default=memory.malloc_mmap_threshold_bytes or 0,
                   help="bytes: larger blocks get their own mapping, returned to the kernel when freed "
                        "and faulted in afresh when allocated; 0: glibc's dynamic threshold (default: %(default)s)")
    h.add_argument("--onednn-cache-capacity", type=int, default=memory.onednn_primitive_cache_capacity,
                   help="oneDNN primitives kept, one per matmul shape; -1: oneDNN's default, 1024 "
                        "(default: %(default)s)")
    h.add_argument("--heap-trim-interval", type=float, default=memory.trim_interval_s,
                   help="seconds of steps between two hand-backs of the free heap to the kernel (and one "
                        "whenever the engine goes idle); 0: never (default: %(default)s)")


def engine_config_from_args(args: argparse.Namespace):
    from engine.config import (CacheConfig, CudaConfig, EngineConfig, HostMemoryConfig, SchedulerConfig,
                               SpeculativeConfig)
    from grammar.config import GrammarConfig
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        cpu_weight_dtype=args.cpu_weight_dtype,
        max_model_len=args.max_model_len,
        num_threads=args.threads,
        quantization=args.quantization,
        quantize_lm_head=args.quantize_lm_head,
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens),
        cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                          kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
                          enable_prefix_caching=not args.no_prefix_caching),
        grammar=GrammarConfig(jump_forward=not args.no_jump_forward, close_early=not args.no_close_early,
                              compile_timeout_s=args.compile_timeout, idle_compiles=not args.no_idle_compiles,
                              schema_worker=not args.no_schema_worker,
                              max_schema_depth=args.max_schema_depth, max_forced_bytes=args.max_forced_bytes,
                              max_repeat_count=args.max_repeat_count, max_fill_ms=args.max_fill_ms,
                              lazy_fill_budget_ms=args.lazy_fill_budget_ms, grammar_backend=args.grammar_backend),
        cuda=CudaConfig(gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
                        attention_backend=args.attention_backend),
        host_memory=HostMemoryConfig(
            malloc_mmap_threshold_bytes=args.malloc_mmap_threshold or None,
            onednn_primitive_cache_capacity=None if args.onednn_cache_capacity < 0 else args.onednn_cache_capacity,
            trim_interval_s=args.heap_trim_interval),
        speculative=SpeculativeConfig(enabled=args.speculative_ngram,
                                      num_speculative_tokens=args.num_speculative_tokens,
                                      draft_by_text=args.draft_by_text),
    )
