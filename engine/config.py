"""Engine configuration: frozen dataclasses, validated on construction."""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from grammar.config import GrammarConfig


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # requests in one step
    max_num_batched_tokens: int = 512  # token budget of one step (prompt chunks + decodes + forced tokens)
    max_num_waiting: int = 1024  # queue length; the front end answers RESOURCE_EXHAUSTED beyond it
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # None: derived from kv_cache_bytes
    kv_cache_bytes: int = 1 << 30  # memory for K and V of all layers when num_blocks is None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")


@dataclass(frozen=True)
class HostMemoryConfig:
    """How the engine process keeps its heap from growing with every new step shape
    (engine/core/host_memory.py; measured in docs/reliability.md, "Soak")."""

    # glibc: blocks of at least this many bytes get their own mapping, handed back to the kernel
    # when freed (and faulted in afresh when allocated); None: glibc's dynamic threshold (it rises
    # to the largest block freed, up to 32 MiB)
    malloc_mmap_threshold_bytes: int | None = 32 << 20
    # oneDNN: compiled primitives kept (one per matmul shape); None: oneDNN's default, 1,024
    onednn_primitive_cache_capacity: int | None = 128
    # hand the heap's free pages back to the kernel after this many seconds of steps, and when the
    # engine goes idle; 0: never
    trim_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.malloc_mmap_threshold_bytes is not None and not 0 < self.malloc_mmap_threshold_bytes <= 32 << 20:
            raise ValueError(f"malloc_mmap_threshold_bytes must be in (0, 32 MiB] (glibc's limit), "
                             f"got {self.malloc_mmap_threshold_bytes}")
        if self.onednn_primitive_cache_capacity is not None and self.onednn_primitive_cache_capacity < 0:
            raise ValueError(f"onednn_primitive_cache_capacity must be >= 0, got {self.onednn_primitive_cache_capacity}")
        if self.trim_interval_s < 0:
            raise ValueError(f"trim_interval_s must be >= 0, got {self.trim_interval_s}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with drafts looked up in the request's own text (engine/spec_decode/speculator.py).

    Each step a request may get a draft of up to `num_speculative_tokens` tokens: the tokens that
    followed an earlier occurrence of its last n tokens (n from `max_ngram` down to `min_ngram`),
    or the prompt text that followed its last few bytes, tokenized; cut where its grammar rejects
    one. The forward pass verifies the draft. How many of those tokens it drafts is priced each
    step: the tokens the draft is expected to give (acceptance rates measured as it runs) against
    what its rows add to the step's measured time.
    """

    # engine default; a request may switch it off (or on). None: on for CPU engines, where it was
    # measured to pay (and greedy outputs are token for token the same: the kernels' bf16 rows are
    # batch-invariant), off on CUDA, where draft steps replay no CUDA graph and nothing was measured
    enabled: bool | None = None
    num_speculative_tokens: int = 8  # draft tokens per request and step, at most
    min_ngram: int = 1
    max_ngram: int = 3
    # a copy goes on from where the last draft was read while this many last tokens agree with it
    copy_check_tokens: int = 1
    # draft by text too: the output's last bytes (`max_text_match` down to `min_text_match`) looked
    # up in the prompt's text, which finds copies whose tokens differ from the prompt's
    draft_by_text: bool = True
    min_text_match: int = 3
    max_text_match: int = 24
    # drafting stops while more requests than this run: a large batch is compute-bound, and
    # verifying drafts costs there what it saves (served json-extraction, quiet: 1.22x at 8
    # running, 0.90x at 16)
    max_num_running: int = 8

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram} and {self.max_ngram}")
        if self.copy_check_tokens < 1:
            raise ValueError(f"copy_check_tokens must be >= 1, got {self.copy_check_tokens}")
        if not 1 <= self.min_text_match <= self.max_text_match:
            raise ValueError(f"need 1 <= min_text_match <= max_text_match, got {self.min_text_match} "
                             f"and {self.max_text_match}")
        if self.max_num_running < 0:
            raise ValueError(f"max_num_running must be >= 0, got {self.max_num_running}")


# ---- CUDA: options that only a CUDA device reads; a CPU engine ignores them ----
CUDA_ATTENTION_BACKENDS = ("auto", "flash_attn", "torch")


@dataclass(frozen=True)
class CudaConfig:
    """How the engine uses a CUDA device (engine/attention/flash.py, engine/worker/cuda_graph.py,
    engine/worker/device_memory.py)."""

    # fraction of the device's total memory the engine may hold (weights + KV cache + activations);
    # the KV cache takes what is left of it after the weights, unless CacheConfig.num_blocks is set
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False  # True: no CUDA graphs, every step runs eagerly
    # "auto": flash-attn when installed and usable with the block size, else torch SDPA (with a warning);
    # "flash_attn": flash-attn or a ValueError saying why not; "torch": torch SDPA over the paged cache
    attention_backend: str = "auto"

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.attention_backend not in CUDA_ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(CUDA_ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")


QUANTIZATIONS = ("int8", "int8:lenient")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # local Hugging Face folder or .gguf file; None: the packaged SmolLM2-135M-Instruct
    device: str = "cpu"
    dtype: str = "auto"  # "auto": bfloat16 on CUDA and on CPUs with bf16 dot products, else float32; see torch_dtype
    # how a float32 model on the CPU kernels holds its matmul weights: "float32", "bfloat16" (rounded
    # once; fp32 activations and sums), or "auto": bfloat16 when dtype is auto, else float32 (then held
    # as bf16 only where that loses nothing: a checkpoint stored in bf16); see cpu_weight_torch_dtype
    cpu_weight_dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's own context length
    num_threads: int | None = None  # torch intra-op threads; None: torch's default
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    cuda: CudaConfig = field(default_factory=CudaConfig)  # read only when device is cuda
    host_memory: HostMemoryConfig = field(default_factory=HostMemoryConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    collect_stats: bool = True  # per-step numbers for the front end's metrics (engine/core/step_stats.py)
    # None: weights in dtype; "int8": the matmul weights as int8 (CPU); "int8:lenient": also serves
    # layers the int8 kernel cannot take, unquantized, instead of refusing the model
    quantization: str | None = None
    quantize_lm_head: bool = False  # with quantization: the lm_head (logits) in int8 too


    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quantization is not None and self.device.startswith("cuda"):
            raise ValueError(f"quantization {self.quantization!r} runs on CPU only; "
                             "the int8 kernels have no CUDA path: leave it unset on CUDA")
        if self.quantize_lm_head and self.quantization is None:
            raise ValueError("quantize_lm_head needs quantization (e.g. --quantization int8)")
        if self.cpu_weight_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"cpu_weight_dtype must be auto, float32 or bfloat16, got {self.cpu_weight_dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    @property
    def resolved_speculative(self) -> SpeculativeConfig:
        """speculative, with enabled None resolved by device."""
        if self.speculative.enabled is not None:
            return self.speculative
        return replace(self.speculative, enabled=not self.device.startswith("cuda"))

    @property
    def quantization_lenient(self) -> bool:
        """Whether layers the int8 kernel cannot take are served unquantized instead of refused."""
        return self.quantization == "int8:lenient"

    @property
    def torch_dtype(self) -> str:
        """The dtype of the weights and activations: dtype, with "auto" resolved by device."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") or cpu_has_bf16_dot() else "float32"

    @property
    def cpu_weight_torch_dtype(self) -> str | None:
        """How a float32 CPU model's packed matmul weights are held: cpu_weight_dtype resolved, None
        for the weights' own dtype (bf16 only where that loses nothing) and wherever nothing is packed
        in float32 (CUDA, bf16 models).

        bf16 for dtype auto: a batch-1 decode step reads every weight once, so half the bytes is
        nearly half the step; the activations and every sum stay fp32, so the answers are those of
        fp32 weights rounded once to bf16, as the bf16 models of bf16 CPUs have them, with fewer
        roundings after that."""
        if self.device.startswith("cuda") or self.torch_dtype != "float32":
            return None
        if self.cpu_weight_dtype == "auto":
            return "bfloat16" if self.dtype == "auto" else None
        return self.cpu_weight_dtype

    @property
    def dtype_choice(self) -> str:
        """What torch_dtype and cpu_weight_torch_dtype came to, and why: for the start-up log."""
        weights = self.cpu_weight_torch_dtype
        held = f", matmul weights held as {weights}" if weights else ""
        if self.dtype != "auto":
            return f"{self.dtype}{held} (as set)"
        if self.device.startswith("cuda"):
            return "bfloat16 (auto: CUDA)"
        if cpu_has_bf16_dot():
            return "bfloat16 (auto: this CPU has bf16 dot products)"
        return (f"float32{held} (auto: this CPU has no bf16 dot products, so the kernels' fp32 GEMM "
                f"({cpu_isa()} build) widens bf16 weights in registers: "
                f"half the bytes a decode step reads)")


# FORMWORK_CPU_ISA -> the variables that hold torch's own CPU ops (ATen's vector kernels, oneDNN,
# MKL) to the same instruction sets as the kernels' build; each library reads its variable once, when
# torch loads
_TORCH_ISA_LIMITS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                              "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}


def cpu_isa() -> str:
    """FORMWORK_CPU_ISA: "native", or "avx2" to run as a CPU with AVX2 + FMA and neither AVX-512 nor
    AMX does (the kernels' build, engine/kernels/loader.py; torch's ops; dtype auto)."""
    return os.environ.get("FORMWORK_CPU_ISA", "native")


def limit_torch_to_cpu_isa() -> None:
    """Holds torch's CPU ops to cpu_isa() (a variable already set is kept). Only before torch is
    imported: later it says so, and torch's ops use what the CPU has."""
    limits = _TORCH_ISA_LIMITS.get(cpu_isa(), {})
    if limits and "torch" in sys.modules and any(os.environ.get(k) != v for k, v in limits.items()):
        logging.getLogger(__name__).warning("FORMWORK_CPU_ISA=%s: torch was imported first, its own ops use every "
                                            "instruction set of this CPU", cpu_isa())
        return
    for name, value in limits.items():
        os.environ.setdefault(name, value)


def cpu_has_bf16_dot() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX). FORMWORK_CPU_ISA=avx2 answers
    as a CPU without either would.

    Measured on a 2-core EPYC with avx512_bf16: the decoder's matmuls at 64 tokens take 67 ms in
    bf16 against 151 ms in fp32 (MKL's fp32 path); without native bf16, bf16 is 3x slower.
    """
    if cpu_isa() == "avx2":
        return False
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_flags() -> list[str]:
    """The feature flags /proc/cpuinfo lists for this CPU ([] where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return []


def model_eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """Every id that ends generation for the model in `model_dir`: generation_config.json's
    `eos_token_id` first (transformers' generate stops on these), then config.json's; each may be
    one id or a list (Llama 3, Qwen and Gemma list the end-of-turn token beside the eos token)."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id") if path.is_file() else None
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"cannot read {str(path)!r}: {e}") from None
        for token_id in [value] if isinstance(value, int) else (value or []):
            if isinstance(token_id, int) and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
