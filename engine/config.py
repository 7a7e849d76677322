"""Engine configuration: frozen dataclasses, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field


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
class GrammarConfig:
    """Grammar work and its bounds: a constraint past one is refused with a message naming the
    limit (at ValidateConstraint too), so one request's grammar never costs the others."""

    compile_timeout_s: float = 10.0
    max_spec_bytes: int = 256 * 1024  # schema / regex / grammar text
    max_schema_depth: int = 64
    cache_bytes: int = 256 << 20
    num_compile_threads: int = 1
    jump_forward: bool = True  # engine default; a request may switch it off (or on)
    # bytes of forced text jump-forward takes per step, and the most output a grammar may need at
    # one point (grammar/output_bounds.py): beyond it, forced text could outgrow any request
    max_forced_bytes: int = 65536
    # counted regex quantifiers ({m,n}, in regexes and schema patterns); xgrammar reads counts as
    # 32-bit integers, so an unbounded count could wrap silently
    max_repeat_count: int = 100_000
    # CPU time of one request's bitmask fill: fills along a short walk are measured at compile
    # time, the others in every step; a request past it ends with an error. Most fills take
    # 0.01-1.5 ms, but a Lark grammar with %ignore takes 60 ms at every gap, so not lower
    max_fill_ms: float = 100.0

    def __post_init__(self) -> None:
        for name in ("max_spec_bytes", "max_schema_depth", "cache_bytes", "num_compile_threads",
                     "max_forced_bytes", "max_repeat_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_repeat_count >= 1 << 31:
            raise ValueError(f"max_repeat_count must be below 2**31, got {self.max_repeat_count}")
        if not self.max_fill_ms > 0:
            raise ValueError(f"max_fill_ms must be > 0, got {self.max_fill_ms}")


# ---- CUDA (issue 7): options that only a CUDA device reads; a CPU engine ignores them ----
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


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # local Hugging Face folder; None: the packaged SmolLM2-135M-Instruct
    device: str = "cpu"
    dtype: str = "auto"  # "auto": bfloat16 on CUDA and on CPUs with bf16 dot products, else float32; see torch_dtype
    max_model_len: int | None = None  # None: the model's own context length
    num_threads: int | None = None  # torch intra-op threads; None: torch's default
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    cuda: CudaConfig = field(default_factory=CudaConfig)  # issue 7: read only when device is cuda

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    @property
    def torch_dtype(self) -> str:
        """The dtype of the weights and activations: dtype, with "auto" resolved by device."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") or cpu_has_bf16_dot() else "float32"


def cpu_has_bf16_dot() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX).

    Measured on a 2-core EPYC with avx512_bf16: the decoder's matmuls at 64 tokens take 67 ms in
    bf16 against 151 ms in fp32 (MKL's fp32 path); without native bf16, bf16 is 3x slower.
    """
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_flags() -> list[str]:
    """The feature flags /proc/cpuinfo lists for this CPU ([] where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return []
