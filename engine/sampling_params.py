"""What a request asks of generation: sampling knobs, stops, and an optional output constraint.

Both structs cross the process boundary inside `EngineCoreRequest`, so they are msgspec structs
(array_like, omit_defaults): compact on the wire, and an unset field costs nothing.
"""
from __future__ import annotations

import math

import msgspec

from grammar.constraint import Constraint

# Ranges of the float knobs (docs/api.md). Past them float32 logits overflow (logits / 1e100 is
# NaN for a masked -inf), and nothing useful lies there: temperature 100 is already uniform.
MAX_TEMPERATURE = 100.0
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True):
    """Sampling and stopping for one request. `validate()` raises ValueError naming the field."""

    max_tokens: int = 256
    # EOS, stop tokens and stop strings cannot end the output before this many tokens; a grammar
    # that allows only EOS still ends it (the constraint wins)
    min_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-n logprobs per sampled token (0: only the sampled token's)
    constraint: Constraint | None = None
    # speculative decoding from drafts in the prompt: None is the server's setting. The output is the
    # same either way; requests with penalties and seeded sampled requests never draft
    speculative: bool | None = None

    def validate(self, vocab_size: int | None = None) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens ({self.max_tokens})], got {self.min_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be at most {MAX_TEMPERATURE:g}, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] "
                             f"(1 disables it), got {self.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if vocab_size is not None:
            bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"stop_token_ids out of range [0, {vocab_size}): {bad}")
        if self.constraint is not None:
            self.constraint.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
