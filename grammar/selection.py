"""The backend the engine sees: xgrammar and llguidance behind one GrammarBackend, each
constraint compiled by the one it names, or by the engine's default, or picked ("auto").

"auto" keeps strict strict: a backend that would drop a keyword refuses a strict constraint (an
UnsupportedError) and the other is tried, as it is when the first's masks would take too long to
serve (a TooCostlyError: xgrammar's fills of an ambiguous repeat such as (\\w+ ?){1,50} take
seconds, llguidance's lazy ones a few ms), or after any refusal when llguidance went first for
speed; a best-effort constraint goes to the backend that leaves nothing out when one does. Among
the backends that enforce it all, the one expected to answer first: xgrammar compiles its token
masks before the first token, llguidance builds each mask as the output reaches it (a few ms to
start, about the same per step, hidden behind the forward). A JSON Schema that does not refer to
itself starts on llguidance whatever its size: xgrammar's compile of even a small one is
unpredictable (a 434-character schema took 400 ms) and one compile at a time, so new schemas queue
behind it. One that does, and any other kind (a regex, a grammar, tool calls), starts on xgrammar
while its text is small: there its compile takes a few ms and does more (parts that never end
refused, think budgets). Both search for
the shortest output when compiling, which closing early needs; where llguidance finds none (too
long, or an output that never ends), xgrammar compiles it.
"""
from __future__ import annotations

import json
import logging
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec

from grammar.backend import GrammarBackend, GrammarError, TooCostlyError, UnsupportedError
from grammar.json_schema.unique_strings import runtime_unique_strings
from grammar.json_schema.walk import has_reference_cycle
from grammar.unique_strings_grammar import UniqueStringsCompiled, UniqueStringsGrammar, quote_token_ids

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import torch

    from grammar.backend import CompiledGrammar, Grammar
    from grammar.config import GrammarConfig
    from grammar.constraint import Constraint

logger = logging.getLogger(__name__)

# spec text (a grammar, a regex, tool definitions) up to which xgrammar's compile is expected to
# take a few tens of ms, past which it reaches seconds; llguidance starts any of them in a few ms
XGRAMMAR_CHEAP_SPEC_CHARS = 2048
# the kinds llguidance is expected to start first at any size: on 62 JSONSchemaBench schemas of at
# most 1.5 KB, each new to the server, its first mask came first on every one (p50 / p99 4 / 19 ms
# against xgrammar's 32 / 628), and served TTFT at 16 in flight fell from 1.2 s to 0.4 s at the
# median (docs/benchmarks.md, "Grammar backends: served, never-seen schemas")
LLGUIDANCE_FIRST_KINDS = frozenset({"json_schema"})


def preferred_order(constraint: Constraint) -> tuple[str, str]:
    """The backends to try for an "auto" constraint, first choice first."""
    if constraint.think_budget:
        return ("xgrammar", "llguidance")  # only xgrammar forces the end marker at the budget
    if len(constraint.spec) > XGRAMMAR_CHEAP_SPEC_CHARS or (
            constraint.kind in LLGUIDANCE_FIRST_KINDS and not _may_refer_to_itself(constraint.spec)):
        return ("llguidance", "xgrammar")
    return ("xgrammar", "llguidance")


def _may_refer_to_itself(spec: str) -> bool:
    """A schema with a reference cycle stays with the size rule: it may have a part that never ends
    though its root does (an optional property whose own required property refers back to it),
    which xgrammar refuses and llguidance, finding a shortest output, would serve to max_tokens."""
    if '"$ref"' not in spec:  # (the text test: no parse for the many schemas without one)
        return False
    try:
        return has_reference_cycle(json.loads(spec))
    except ValueError:
        return False  # the backend names the error


class SelectingBackend(GrammarBackend):
    """Dispatches each constraint to a backend by name (Constraint.grammar_backend, else
    GrammarConfig.grammar_backend); "auto" follows preferred_order with the fallbacks above.
    The compiled grammar carries its backend's name, and make_grammar hands it to that backend.
    Both backends share the tokenizer, so bitmask layout, token bytes and text encoding are one."""

    def __init__(self, backends: dict[str, GrammarBackend], config: GrammarConfig) -> None:
        if not backends:
            raise ValueError("SelectingBackend needs at least one backend")
        self._backends = backends
        self._default = config.grammar_backend
        first = next(iter(backends.values()))
        self.token_bytes: Sequence[bytes] | None = first.token_bytes
        self._first = first
        self._quote_token_ids: list[int] | None = None  # for UniqueStringsGrammar, found on first use

    @property
    def backends(self) -> Mapping[str, GrammarBackend]:
        """The backends by name (read-only: the selection owns them)."""
        return MappingProxyType(self._backends)

    def use_schema_runner(self, runner: Callable[..., Any]) -> None:
        self.schema_runner = runner
        for backend in self._backends.values():
            backend.use_schema_runner(runner)

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The constraint compiled by the backend it names (or picked); a JSON schema's
        uniqueItems over free strings is taken out and enforced beside the matcher, on either
        backend (grammar/unique_strings_grammar.py)."""
        moved = self._unique_strings(constraint)
        if moved is None:
            return self._compile_named(constraint)
        spec, paths = moved
        return UniqueStringsCompiled(self._compile_named(msgspec.structs.replace(constraint, spec=spec)), paths)

    def _unique_strings(self, constraint: Constraint) -> tuple[str, dict] | None:
        """(the schema text without those uniqueItems, their path tree), or None: none, or no
        token bytes to follow the output with, or a think section before the JSON."""
        if constraint.kind != "json_schema" or constraint.think_end or self.token_bytes is None or \
                '"uniqueItems"' not in constraint.spec:
            return None  # (the text test: no parse for the many schemas without one)
        try:
            schema = json.loads(constraint.spec)
        except ValueError:
            return None  # the backend names the error
        moved = runtime_unique_strings(schema)
        return None if moved is None else (json.dumps(moved[0]), moved[1])

    def _compile_named(self, constraint: Constraint) -> CompiledGrammar:
        name = constraint.grammar_backend or self._default
        if name != "auto":
            return self._compile_with(name, constraint)
        order = [n for n in preferred_order(constraint) if n in self._backends]
        first, second = order[0], (order[1] if len(order) > 1 else None)
        try:
            compiled = self._compile_with(first, constraint)
        except (UnsupportedError, TooCostlyError) as e:
            if second is None:
                raise
            try:
                return self._compile_with(second, constraint)
            except GrammarError as other:
                raise GrammarError(_both_refusals({first: e, second: other})) from None
        except GrammarError:
            if second != "xgrammar":
                raise
            # llguidance was first only for speed: xgrammar, the default, has the last word (its
            # message, too), so a spec is never refused for being large
            return self._compile_with(second, constraint)
        if compiled.min_output_tokens is None and second == "xgrammar":
            # llguidance found no shortest output: closing early would not know what to keep for
            # it, and an output that never ends would run to max_tokens. xgrammar refuses the
            # latter and otherwise does what the default always did; its refusal stands, but for
            # a keyword it does not enforce
            try:
                return self._compile_with(second, constraint)
            except UnsupportedError:
                return compiled
        if compiled.not_enforced and second is not None:  # best effort: does the other leave nothing out?
            try:
                other = self._compile_with(second, constraint)
            except GrammarError:
                return compiled
            if len(other.not_enforced) < len(compiled.not_enforced):
                return other
        return compiled

    def _compile_with(self, name: str, constraint: Constraint) -> CompiledGrammar:
        backend = self._backends.get(name)
        if backend is None:
            raise GrammarError(f"grammar backend {name!r} is not available on this server")
        compiled = backend.compile(constraint)
        compiled.backend_name = name
        return compiled

    def make_grammar(self, compiled: CompiledGrammar) -> Grammar:
        if isinstance(compiled, UniqueStringsCompiled):
            token_bytes = self.token_bytes
            if token_bytes is None:
                raise TypeError("a grammar with distinct strings needs token bytes")  # compile wraps only with them
            if self._quote_token_ids is None:
                self._quote_token_ids = quote_token_ids(token_bytes)
            return UniqueStringsGrammar(self.make_grammar(compiled.inner), compiled.paths, token_bytes,
                                        self._quote_token_ids)
        backend = self._backends.get(compiled.backend_name)
        if backend is None:
            raise TypeError(f"no backend {compiled.backend_name!r} for a {type(compiled).__name__}")
        return backend.make_grammar(compiled)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return self._first.allocate_bitmask(num_rows)

    def text_encoder(self) -> Callable[[str], list[int]] | None:
        return self._first.text_encoder()


def _both_refusals(errors: dict[str, GrammarError]) -> str:
    """Two backends' refusals in one message, xgrammar's first whichever was tried first:
    llguidance's points to xgrammar, and xgrammar's, beside it, answers that."""
    (_, first), (second_name, second) = sorted(errors.items(), key=lambda item: item[0] != "xgrammar")
    return f"{first} ({second_name}: {second})"


def make_selecting_backend(tokenizer_dir: str, vocab_size: int, config: GrammarConfig) -> SelectingBackend:
    """Both backends on one tokenizer (a request may name either, whatever the default)."""
    from grammar.llguidance.backend import LLGuidanceBackend
    from grammar.xgrammar.backend import XGrammarBackend

    return SelectingBackend({"xgrammar": XGrammarBackend(tokenizer_dir, vocab_size, config=config),
                             "llguidance": LLGuidanceBackend(tokenizer_dir, vocab_size, config=config)}, config)
