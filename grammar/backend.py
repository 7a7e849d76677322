"""The small abstract pair the engine sees: a backend that compiles, a per-request matcher.

Any grammar library can sit behind these; the engine never imports one directly.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch

    from grammar.constraint import Constraint


def run_here(fn: Callable[..., Any], *args: Any, num_chars: int = 0) -> Any:
    """A GrammarBackend's schema_runner unless one is set: fn(*args) in the calling thread."""
    return fn(*args)


class GrammarError(ValueError):
    """A constraint that cannot be compiled or enforced; the message names the problem."""


class UnsupportedError(GrammarError):
    """A valid constraint that this backend does not enforce (a keyword, a feature): another
    backend may (grammar/selection.py tries it)."""


class TooCostlyError(GrammarError):
    """A valid constraint this backend enforces, but too slowly to serve (its masks take longer than
    the server allows): a backend that builds them another way may not (grammar/selection.py tries it)."""


class FirstFillBudget(Protocol):
    """CPU time a request may spend waiting for first fills (grammar/runtime/slow_fills.py's SlowFills)."""

    def spend(self, fill_ms: float) -> bool:
        """Count `fill_ms`; False once the budget is spent."""


class CompiledGrammar(ABC):
    """An immutable compiled constraint, shareable by many requests (it lives in the cache)."""

    # what a best-effort constraint does not enforce, as "keyword at /json/pointer"
    # (e.g. "uniqueItems at /properties/tags"); always empty for a strict constraint
    not_enforced: list[str] = []
    # tokens of the shortest output found when compiling (Grammar.closing_token_ids from the
    # start, with a larger search budget); None: not known
    min_output_tokens: int | None = None
    # its token masks are built on first use: a state's first fill builds its mask (tens of ms,
    # up to ~1 s), later fills of that state take microseconds (GrammarConfig.lazy_fill_budget_ms)
    lazy_masks: bool = False
    # the library that compiled it ("xgrammar", "llguidance"), reported with the request
    backend_name: str = ""

    @property
    @abstractmethod
    def num_bytes(self) -> int:
        """Approximate memory held, for the byte-bounded cache. With lazy_masks it grows as
        requests build masks (towards the eager grammar's size): the cache counts it again on
        each hit."""


class Grammar(ABC):
    """Per-request matcher state. Not thread-safe: one engine thread drives it."""

    not_enforced: list[str] = []
    lazy_masks: bool = False  # its compiled grammar's (CompiledGrammar.lazy_masks)

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bits of the next position into `bitmask[row]` (CPU, int32).

        Does not change the matcher. Bits of padding ids (past the tokenizer's vocabulary) and
        past vocab_size are always 0, so a row with no bit set means nothing is allowed. Stop
        tokens are allowed exactly where the output may end.
        """

    @abstractmethod
    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over `token_ids`, all or nothing: on a rejected token, return False with the
        matcher as it was before the call."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (jump-forward ones included)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True after a stop token was accepted, or once the output is complete and nothing may
        follow it (a closed JSON object): the request can finish without sampling an EOS."""

    @abstractmethod
    def jump_forward_token_ids(self) -> list[int]:
        """Tokens the grammar forces next, safe to append without sampling (may be empty).

        The tokens are already accepted by the matcher when this returns. The returned
        sequence never ends at a place where the model's own tokenization would merge the forced
        text with what follows.
        """

    def closing_token_ids(self, max_tokens: int, first_fills: FirstFillBudget | None = None, max_nodes: int = 1000,
                          max_cpu_s: float = 0.02) -> list[int] | None:
        """Tokens that complete the output from here, at most `max_tokens` of them: the text that
        closes what is open (a string, required properties with minimal values, the containers),
        then a stop token unless nothing may follow it anyway. Not accepted: the matcher is as
        it was. None when no closing is found within `max_tokens` (or the backend cannot tell).
        `first_fills`: pays for the search's waits on lazily built masks; `max_nodes`, `max_cpu_s`:
        the search's own budget, a step's by default (grammar/runtime/closing_search.py)."""
        return None

    def completes(self, token_ids: list[int], strict: bool = False) -> bool:
        """Whether `token_ids`, a closing found earlier, still complete the output from here: the
        grammar accepts them and the output is complete after them (a stop token may still be
        needed). `strict`: also all that closing_token_ids checks of its answer, so that they can
        be appended as they are. Changes nothing. False when the backend cannot tell."""
        return False


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer. `compile` is blocking and thread-safe."""

    # each token id's bytes, for the runaway guard (grammar/runtime/runaway.py); None: not known, no guard
    token_bytes: Sequence[bytes] | None = None
    # the JSON-schema `format` values whose strings this backend checks: the schema rewrite takes
    # any other as an annotation and notes it (grammar/json_schema/scalars.py)
    enforced_formats: frozenset[str] = frozenset()

    # where `compile` runs its pure-Python schema work: `schema_runner(fn, *args, num_chars=spec chars)`
    # returns fn(*args), here (run_here) or in the schema worker (grammar/schema_worker.py)
    schema_runner: Callable[..., Any] = staticmethod(run_here)

    def use_schema_runner(self, runner: Callable[..., Any]) -> None:
        """Run the pure-Python part of compiles through `runner` (SchemaWorker.run) from now on."""
        self.schema_runner = runner

    def text_encoder(self) -> Callable[[str], list[int]] | None:
        """The tokenizer's plain encoding of a text (no special tokens added), for text that
        continues an output; None when the backend has none, or the tokenizer cannot encode text
        in the middle of an output (one that prepends a space to every text)."""
        return None

    @abstractmethod
    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile, raising GrammarError with a precise message on failure (a bad spec, or in
        strict mode a keyword the backend would not enforce). Size and depth limits are the
        caller's: GrammarCompiler checks them first."""

    @abstractmethod
    def make_grammar(self, compiled: CompiledGrammar) -> Grammar:
        """A fresh matcher at the start of the constrained output."""

    @abstractmethod
    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """An int32 [num_rows, ceil(vocab_size / 32)] tensor, all tokens allowed."""
