"""XGrammarBackend: every constraint kind compiled with xgrammar for one tokenizer."""
from __future__ import annotations

import json
import logging
import random
import time
from typing import TYPE_CHECKING

import numpy as np
import torch
import xgrammar as xgr

from grammar.backend import CompiledGrammar, GrammarBackend, GrammarError, TooCostlyError
from grammar.chat.structural_tag import (StructuralTagError, content_field, is_older_shape, map_contents,
                                         parse_structural_tag)
from grammar.chat.tool_call_format import tool_calls_format
from grammar.chat.tool_calls import ToolCalls
from grammar.constraint_parts import answer_constraint, content_constraint, tool_arguments
from grammar.constraint import Constraint
from grammar.json_schema.limits import check_limits
from grammar.runtime.closing_hints import closing_hints
from grammar.runtime.early_closing import shortest_output_tokens
from grammar.runtime.jump_forward import ForcedTextTokenizer
from grammar.runtime.low_priority import run_at_low_priority
from grammar.runtime.slow_fills import SlowFills
from grammar.xgrammar import json_grammar, lark_grammar, output_bounds, structural_tags
from grammar.xgrammar.conversion import builds_masks_lazily, check_repeats, choice_ebnf, convert_spec
from grammar.xgrammar.log_capture import strip_native_prefix
from grammar.xgrammar.matcher import XGrammarCompiled, XGrammarGrammar
from grammar.runtime.char_tokens import CharTokens
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS

if TYPE_CHECKING:
    from collections.abc import Callable

    from grammar.config import GrammarConfig

logger = logging.getLogger(__name__)

_PROBE_TOKENS = 8  # tokens the compile-time fill probe walks


class XGrammarBackend(GrammarBackend):
    """Compiles every constraint kind for one tokenizer with xgrammar. `compile` is thread-safe.

    Size and depth limits are the caller's job (GrammarCompiler checks them before calling).
    """

    enforced_formats = ENFORCED_FORMATS

    def __init__(self, tokenizer_dir: str, vocab_size: int, *, num_threads: int = 1,
                 config: GrammarConfig | None = None) -> None:
        """`vocab_size` is the LM head's width; ids from the tokenizer's size up to it are
        padding and are never allowed. `num_threads`: xgrammar's threads per compile.
        `config`: the bounds a grammar must keep (max_forced_bytes, max_repeat_count, max_fill_ms)."""
        from transformers import AutoTokenizer

        from grammar.config import GrammarConfig

        self.config = config or GrammarConfig()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        if vocab_size < len(self.tokenizer):
            logger.warning("vocab_size %d is smaller than the tokenizer's %d; ids beyond it are never allowed",
                           vocab_size, len(self.tokenizer))
        self.vocab_size = vocab_size
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab_size)
        self.stop_token_ids = list(self.tokenizer_info.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=num_threads, cache_enabled=False)
        self._lazy_compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=num_threads,
                                                  cache_enabled=False, enable_dynamic_compilation=True)
        # a tokenizer that prepends a space to every encoded text cannot encode mid-output text
        prefix_space = self.tokenizer_info.add_prefix_space
        self.forced_text = ForcedTextTokenizer(self.tokenizer, enabled=not prefix_space)
        self.token_bytes = self.tokenizer_info.decoded_vocab
        self.char_tokens = CharTokens.of_vocabulary(
            lambda text: self.tokenizer.encode(text, add_special_tokens=False), self.token_bytes)

    def compile(self, constraint: Constraint) -> XGrammarCompiled:
        """Also refuses a grammar that would cost more than its own request (a GrammarError):
        one that can never end or needs more than max_forced_bytes of output at one point,
        a regex count over max_repeat_count, or a first bitmask fill over max_fill_ms. The
        first matcher and bitmask fill run here, on the compile thread, rather than in a step."""
        kind = constraint.kind
        not_enforced: list[str] = []
        if kind == "json_schema" and not constraint.think_end:  # its Python part may run in the schema worker
            prepared = self.schema_runner(json_grammar.prepare, constraint, self.config, num_chars=len(constraint.spec))
            grammar = xgr.Grammar.from_ebnf(prepared.ebnf)
            not_enforced += prepared.not_enforced
            bounds, hints = prepared.bounds, prepared.closing_hints
        else:
            structural = kind in ("tool_calls", "structural_tag")
            grammar = None if structural else self._plain_grammar(constraint, not_enforced)
            if structural or constraint.think_end:
                grammar = self._structural_grammar(constraint, grammar, not_enforced)
            bounds = json_grammar.check_bounds(kind, grammar, self.config.max_forced_bytes)
            hints = closing_hints(constraint)
        lazy_masks = builds_masks_lazily(str(grammar))
        compiler = self._lazy_compiler if lazy_masks else self._compiler
        try:
            compiled = compiler.compile_grammar(grammar)
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with a C++ prefix
            raise GrammarError(f"{kind} does not compile: {strip_native_prefix(str(e))}") from None
        result = XGrammarCompiled(compiled, kind, not_enforced, jump_forward_safe=bounds.exact,
                                  closing_hints=hints,
                                  json_output=kind in ("json_schema", "json_object") and not constraint.think_end,
                                  lazy_masks=lazy_masks)
        self._warm_up(result)
        result.min_output_tokens = shortest_output_tokens(self.make_grammar(result))
        return result

    def _plain_grammar(self, constraint: Constraint, not_enforced: list[str]) -> xgr.Grammar:
        """The grammar of a constraint of one of CONSTRAINT_KINDS, think section aside."""
        kind = constraint.kind
        if kind in ("json_schema", "json_object"):
            grammar, notes = json_grammar.json_grammar(constraint, self.config.max_repeat_count)
            not_enforced += notes
        elif kind == "regex":
            check_repeats("regex", constraint.spec, self.config.max_repeat_count)
            grammar = convert_spec(kind, constraint.strict, not_enforced, xgr.Grammar.from_regex, constraint.spec)
        elif kind == "grammar":
            try:  # a Lark grammar (vLLM's guided_grammar) is translated; EBNF passes unchanged
                ebnf = lark_grammar.to_ebnf(constraint.spec, constraint.grammar_syntax or "auto")
            except lark_grammar.LarkGrammarError as e:
                raise GrammarError(f"grammar (Lark) is not supported: {e}") from None
            grammar = convert_spec(kind, constraint.strict, not_enforced, xgr.Grammar.from_ebnf, ebnf)
        elif kind == "choice":
            grammar = convert_spec(kind, True, not_enforced, xgr.Grammar.from_ebnf, choice_ebnf(constraint.choices))
        else:
            raise GrammarError(f"unknown constraint kind {kind!r}")
        return grammar

    def make_grammar(self, compiled: CompiledGrammar) -> XGrammarGrammar:
        if not isinstance(compiled, XGrammarCompiled):
            raise TypeError(f"expected a grammar compiled by XGrammarBackend, got {type(compiled).__name__}")
        return XGrammarGrammar(compiled, self.forced_text, self.stop_token_ids, self.vocab_size,
                               self.config.max_forced_bytes, self.char_tokens, self.token_bytes)

    def text_encoder(self) -> Callable[[str], list[int]] | None:
        return self.forced_text.encode if self.forced_text.enabled else None

    def output_bounds(self, grammar: xgr.Grammar) -> output_bounds.OutputBounds:
        """What the grammar's rules need (grammar/xgrammar/json_grammar.py's output_bounds_of)."""
        return json_grammar.output_bounds_of(grammar)

    def _warm_up(self, compiled: XGrammarCompiled) -> None:
        """Build the first matcher and fill bitmasks along a short walk here, where a slow fill
        costs only this compile; refuse a grammar whose fill takes more than max_fill_ms of CPU.

        A compiled grammar's first fill builds xgrammar's lazy caches (66 ms for a Lark
        calculator whose later fills take 1 ms): it runs here once, untimed, so no step pays
        it. The fills after it are timed along a walk of a few allowed tokens, chosen by a fixed
        seed: ambiguous repeats (`(\\w+ ?){1,50}`) fill fast at the start and take seconds a
        token or two later. The walk runs at the lowest CPU priority (grammar/runtime/low_priority.py), so
        a grammar that takes those seconds takes them from its own compile, not from the forward pass.
        """
        run_at_low_priority(self._probe_fills, compiled)

    def _probe_fills(self, compiled: XGrammarCompiled) -> None:
        slow_fills = SlowFills(self.config, compiled.lazy_masks)
        rng = random.Random(0)
        stop_ids = set(self.stop_token_ids)
        try:
            matcher = xgr.GrammarMatcher(compiled.compiled)
            bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
            matcher.fill_next_token_bitmask(bitmask, 0)  # the lazy caches; the same fill is timed next
            for num_tokens in range(_PROBE_TOKENS + 1):
                start = time.thread_time()
                matcher.fill_next_token_bitmask(bitmask, 0)
                fill_ms = (time.thread_time() - start) * 1000
                if not slow_fills.allows(fill_ms):
                    raise TooCostlyError(f"{compiled.kind}: one bitmask fill takes {fill_ms:.0f} ms (after {num_tokens} "
                                       f"tokens), over {slow_fills.limit_text()}; simplify the constraint "
                                       "(ambiguous repeats such as (\\w+ ?){1,50} are the usual cause)")
                bits = np.unpackbits(bitmask.numpy().view(np.uint8)[0], bitorder="little")[:self.vocab_size]
                allowed = [t for t in np.flatnonzero(bits).tolist() if t not in stop_ids]
                if not allowed or not matcher.accept_token(rng.choice(allowed)):
                    return
        except GrammarError:
            raise
        except Exception as e:  # e.g. std::bad_alloc: this grammar's failure, reported as such
            raise GrammarError(f"{compiled.kind}: its first bitmask fills failed: {type(e).__name__}: "
                               f"{strip_native_prefix(str(e))}") from None

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(num_rows, self.vocab_size)

    # -- tool calls and think sections -------------------------------------------------------

    def _structural_grammar(self, constraint: Constraint, grammar: xgr.Grammar | None,
                            not_enforced: list[str]) -> xgr.Grammar:
        """A tool_calls or structural_tag constraint's grammar, and/or `grammar` after a think
        section: one structural-tag format, compiled by xgrammar."""
        if constraint.kind == "tool_calls":
            answer = self._tool_calls_format(constraint, not_enforced)
        elif constraint.kind == "structural_tag":
            answer = self._structural_tag_format(constraint, not_enforced)
        else:
            assert grammar is not None
            answer = structural_tags.grammar_format(str(grammar))
        if constraint.think is not None:
            thinking = structural_tags.grammar_format(str(self._plain_grammar(constraint.think, not_enforced)))
            answer = structural_tags.constrained_think_then(answer, thinking, constraint.think_start,
                                                            constraint.think_end)
        elif constraint.think_end:
            answer = structural_tags.think_then(answer, constraint.think_end, constraint.think_budget)
        try:
            return xgr.Grammar.from_structural_tag(json.dumps(structural_tags.structural_tag(answer)))
        except Exception as e:
            raise GrammarError(f"{constraint.kind} does not compile: {strip_native_prefix(str(e))}") from None

    def _tool_calls_format(self, constraint: Constraint, not_enforced: list[str]) -> structural_tags.Format:
        """Each allowed tool's arguments compiled as a json_schema constraint with the same options,
        so a schema is refused (or listed as not enforced) exactly as json_schema would be, with
        the tool's index and name in front of the keyword's JSON pointer."""
        try:
            spec = ToolCalls.from_spec(constraint.spec)
        except ValueError as e:
            raise GrammarError(str(e)) from None
        arguments = tool_arguments(spec, constraint, lambda content, where, note: structural_tags.grammar_format(
            self._content_grammar(content, where, note, not_enforced)), not_enforced)
        return tool_calls_format(spec, arguments, self._answer_format(constraint, spec, not_enforced))

    def _structural_tag_format(self, constraint: Constraint, not_enforced: list[str]) -> structural_tags.Format:
        """The request's own structural tag, each schema, regex and grammar inside it compiled as
        a constraint of that kind with the tag's options (strictness, whitespace), so that it is
        refused or listed as not enforced exactly as on its own, its path in front."""
        try:
            format_ = parse_structural_tag(constraint.spec)
        except StructuralTagError as e:
            raise GrammarError(f"structural_tag {e}") from None
        older_shape = is_older_shape(constraint.spec)

        def compile_content(leaf: structural_tags.Format, path: str) -> structural_tags.Format:
            field = content_field(path, leaf, older_shape)
            content = content_constraint(constraint, leaf, field, self.config)
            return structural_tags.grammar_format(self._content_grammar(content, field, field, not_enforced))
        return map_contents(format_, compile_content)

    def _content_grammar(self, content: Constraint, error_label: str, note_label: str,
                         not_enforced: list[str]) -> str:
        """The EBNF of a constraint inside a structural format (a tool's arguments, a structural
        tag's content), checked as it would be on its own: an error starts with `error_label` (an
        unsupported keyword stays UnsupportedError), a not-enforced note with `note_label`."""
        notes: list[str] = []
        try:
            check_limits(content, self.config.max_spec_bytes, self.config.max_schema_depth)
            grammar = self._plain_grammar(content, notes)
        except GrammarError as e:
            raise type(e)(f"{error_label}: {e}") from None
        not_enforced += [f"{note_label}: {note}" for note in notes]
        return str(grammar)

    def _answer_format(self, constraint: Constraint, spec: ToolCalls,
                       not_enforced: list[str]) -> structural_tags.Format | None:
        """The format a text answer follows beside the calls (ToolCalls.answer), with the tool
        constraint's options: a structural tag's own tree (its tags may join the calls'), else
        the answer's grammar; None: free text."""
        if spec.answer is None:
            return None
        answer = answer_constraint(constraint, spec.answer, self.config)
        if answer.kind == "structural_tag":
            return self._structural_tag_format(answer, not_enforced)
        return structural_tags.grammar_format(str(self._plain_grammar(answer, not_enforced)))
