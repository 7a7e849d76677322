"""Limits and defaults of grammar compilation (one per engine)."""
from __future__ import annotations

from dataclasses import dataclass

# which library compiles a constraint ("auto": grammar/selection.py picks per constraint)
GRAMMAR_BACKENDS = ("auto", "xgrammar", "llguidance")


@dataclass(frozen=True)
class GrammarConfig:
    """Grammar work and its bounds: a constraint past one is refused with a message naming the
    limit (at ValidateConstraint too), so one request's grammar never costs the others."""

    compile_timeout_s: float = 10.0
    max_spec_bytes: int = 256 * 1024  # schema / regex / grammar text
    max_schema_depth: int = 64
    cache_bytes: int = 256 << 20
    num_compile_threads: int = 1
    # compiles run in Linux's idle scheduling class, rescued when starved (grammar/compiler.py):
    # a heavy schema's compile then costs the running requests next to nothing
    idle_compiles: bool = True
    # the pure-Python part of a large schema's compile runs in a worker process (grammar/schema_worker.py):
    # in the engine's process it would hold the GIL the engine thread needs
    schema_worker: bool = True
    jump_forward: bool = True  # engine default; a request may switch it off (or on)
    # bytes of forced text jump-forward takes per step, and the most output a grammar may need at
    # one point (grammar/xgrammar/output_bounds.py): beyond it, forced text could outgrow any request
    max_forced_bytes: int = 65536
    # counted regex quantifiers ({m,n}, in regexes and schema patterns); xgrammar reads counts as
    # 32-bit integers, so an unbounded count could wrap silently
    max_repeat_count: int = 100_000
    # CPU time of one request's bitmask fill: fills along a short walk are measured at compile
    # time, the others in every step; a request past it ends with an error. Most fills take
    # 0.01-1.5 ms, but a Lark grammar with %ignore takes 60 ms at every gap, so not lower
    max_fill_ms: float = 100.0
    # a grammar that builds its token masks on first use (grammar/xgrammar/conversion.py)
    # fills a state slowly once, building its mask (10-50 ms, 0.65 s measured for one state of a
    # 5,590-rule grammar): its fills over max_fill_ms may add up to this much CPU time in one
    # request (and in the compile's walk) before it ends with the same error
    lazy_fill_budget_ms: float = 2000.0
    # close a constrained output before it runs out of tokens, and the JSON kinds' runaway loops
    # (grammar/runtime/early_closing.py); engine default, a request may switch it off (or on)
    close_early: bool = True
    # the library that compiles a constraint which names none: "auto" (grammar/selection.py picks
    # per constraint), "xgrammar" or "llguidance"
    grammar_backend: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_spec_bytes", "max_schema_depth", "cache_bytes", "num_compile_threads",
                     "max_forced_bytes", "max_repeat_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_repeat_count >= 1 << 31:
            raise ValueError(f"max_repeat_count must be below 2**31, got {self.max_repeat_count}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {', '.join(GRAMMAR_BACKENDS)}, got "
                             f"{self.grammar_backend!r}")
        for name in ("max_fill_ms", "lazy_fill_budget_ms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
