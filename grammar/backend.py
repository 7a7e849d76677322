"""The small abstract pair the engine sees: a backend that compiles, a per-request matcher.

Any grammar library can sit behind these; the engine never imports one directly.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from engine.sampling_params import Constraint


class GrammarError(ValueError):
    """A constraint that cannot be compiled or enforced; the message names the problem."""


class CompiledGrammar(ABC):
    """An immutable compiled constraint, shareable by many requests (it lives in the cache)."""

    # JSON pointers / keywords that are accepted but not enforced (best-effort mode only)
    not_enforced: list[str] = []

    @property
    @abstractmethod
    def num_bytes(self) -> int:
        """Approximate memory held, for the byte-bounded cache."""


class Grammar(ABC):
    """Per-request matcher state. Not thread-safe: one engine thread drives it."""

    not_enforced: list[str] = []

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bits of the next position into `bitmask[row]`."""

    @abstractmethod
    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`; False (and no state change past the bad token) if one is rejected."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar accepted a complete output and nothing may follow."""

    @abstractmethod
    def jump_forward_token_ids(self) -> list[int]:
        """Tokens the grammar forces next, safe to append without sampling (may be empty).

        The tokens are already accepted by the matcher when this returns. The returned
        sequence never ends at a place where the model's own tokenization would merge the forced
        text with what follows.
        """


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer. `compile` is blocking and thread-safe."""

    @abstractmethod
    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile, raising GrammarError with a precise message on failure."""

    @abstractmethod
    def make_grammar(self, compiled: CompiledGrammar) -> Grammar:
        """A fresh matcher at the start of the constrained output."""

    @abstractmethod
    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """An int32 [num_rows, ceil(vocab_size / 32)] tensor, all tokens allowed."""
