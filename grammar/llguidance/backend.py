"""LLGuidanceBackend: every constraint kind compiled with llguidance for one tokenizer."""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import llguidance as llg
import llguidance.hf as llg_hf
from llguidance.gbnf_to_lark import any_to_lark

from grammar.backend import GrammarBackend, GrammarError, UnsupportedError
from grammar.chat.tool_call_format import tool_calls_format
from grammar.chat.tool_calls import ToolCalls
from grammar.chat.structural_tag import (StructuralTagError, content_field, is_older_shape, map_contents,
                                         parse_structural_tag)
from grammar.constraint_parts import answer_constraint, content_constraint, tool_arguments
from grammar.json_schema.limits import check_limits
from grammar.llguidance import lark_text, output_bounds, prepared_schema
from grammar.llguidance.json_options import (ENFORCED_FORMATS, WHITESPACE_OPTIONS, keyword_locations,
                                             unimplemented_keywords)
from grammar.llguidance.matcher import LLGuidanceCompiled, LLGuidanceGrammar
from grammar.llguidance.structural_lark import structural_lark
from grammar.llguidance.token_bitmask import allocate_token_bitmask, fill_next_token_bitmask
from grammar.regex.repeat_counts import find_large_repeat
from grammar.runtime.char_tokens import CharTokens
from grammar.runtime.closing_hints import closing_hints
from grammar.runtime.early_closing import shortest_output_tokens
from grammar.runtime.jump_forward import ForcedTextTokenizer

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from grammar.backend import CompiledGrammar
    from grammar.config import GrammarConfig
    from grammar.constraint import Constraint

logger = logging.getLogger(__name__)

_MAX_ERROR_CHARS = 400  # llguidance's messages can quote a whole grammar


class LLGuidanceBackend(GrammarBackend):
    """Compiles constraints with llguidance for one tokenizer. `compile` is thread-safe.

    Compiling validates the grammar, builds a template matcher and searches for the shortest output
    (as on xgrammar, so closing early keeps its budget and a max_tokens below it is refused); no
    token mask is built ahead (llguidance computes each step's mask from its lexer and parser), so
    a new schema answers in milliseconds. Think sections with a token budget are refused (an
    UnsupportedError, so auto takes xgrammar): the budget's forced end marker is xgrammar's; so
    are the parts of a structural tag structural_lark.py cannot write.
    """

    name = "llguidance"
    enforced_formats = ENFORCED_FORMATS

    def __init__(self, tokenizer_dir: str, vocab_size: int, *, config: GrammarConfig | None = None) -> None:
        """`vocab_size` is the LM head's width; ids from the tokenizer's size up to it are
        padding and are never allowed."""
        from transformers import AutoTokenizer

        from grammar.config import GrammarConfig

        self.config = config or GrammarConfig()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.vocab_size = vocab_size
        self.stop_token_ids = [self.tokenizer.eos_token_id]
        self.llg_tokenizer = llg_hf.from_tokenizer(self.tokenizer, n_vocab=vocab_size, eos_token=self.stop_token_ids)
        self._limits = llg.LLParserLimits(verbose_errors=False)
        # a tokenizer that prepends a space to every encoded text cannot encode mid-output text
        prefix_space = bool(getattr(self.tokenizer, "add_prefix_space", False))
        self.forced_text = ForcedTextTokenizer(self.tokenizer, enabled=not prefix_space)
        num_tokens = len(self.tokenizer)
        self.token_bytes = [self.llg_tokenizer.decode_bytes([t]) if t < num_tokens else b""
                            for t in range(vocab_size)]
        self.char_tokens = CharTokens.of_vocabulary(
            lambda text: self.tokenizer.encode(text, add_special_tokens=False), self.token_bytes)

    def compile(self, constraint: Constraint) -> LLGuidanceCompiled:
        if constraint.think_budget:
            raise UnsupportedError("think_budget is not enforced by the llguidance backend (its end marker cannot "
                               "be forced after a token count); use the xgrammar backend")
        not_enforced: list[str] = []
        if constraint.kind == "json_schema" and not constraint.think_end:  # the hints come with the schema
            prepared = self._prepared_schema(constraint, with_hints=True)
            not_enforced += prepared.notes
            grammar = self._json_grammar(constraint, prepared.schema, not_enforced)
            hints = prepared.closing_hints
        else:
            grammar = self._grammar(constraint, not_enforced)
            hints = closing_hints(constraint)
        if constraint.think is not None:
            thinking = self._grammar(constraint.think, not_enforced)
            grammar = _compose(lark_text.constrained_think_then("@answer", "@think", constraint.think_start,
                                                                constraint.think_end),
                               {"think": thinking, "answer": grammar})
        elif constraint.think_end:
            grammar = _compose(lark_text.think_then("@answer", constraint.think_end), {"answer": grammar})
        template = llg.LLMatcher(self.llg_tokenizer, grammar, log_level=0, limits=self._limits)
        if template.is_error():
            raise GrammarError(f"{constraint.kind} does not compile: {_short(template.get_error())}")
        notes = [w for w in template.get_grammar_warnings() if not unimplemented_keywords(w)]
        if notes and constraint.strict:
            raise GrammarError(f"{constraint.kind} is not fully enforceable: {_short(notes[0])}")
        not_enforced += [f"{constraint.kind}: {_short(n)}" for n in notes]
        self._probe_first_fill(constraint.kind, template)
        compiled = LLGuidanceCompiled(template, grammar, constraint.kind, not_enforced, hints)
        compiled.min_output_tokens = shortest_output_tokens(self.make_grammar(compiled))
        return compiled

    def _grammar(self, constraint: Constraint, not_enforced: list[str]) -> str:
        """llguidance's grammar text (its JSON form) of a constraint, think section aside."""
        kind = constraint.kind
        if kind in ("json_schema", "json_object"):
            schema = self._json_schema(constraint, not_enforced)
            return self._json_grammar(constraint, schema, not_enforced)
        if kind == "regex":
            self._check_repeats(constraint.spec)
            output_bounds.check_regex(kind, constraint.spec, self.config.max_forced_bytes)
            return llg.LLMatcher.grammar_from_regex(constraint.spec)
        if kind == "grammar":
            return llg.LLMatcher.grammar_from_lark(self._lark(constraint))
        if kind == "choice":
            return llg.LLMatcher.grammar_from_lark(lark_text.choice_lark(constraint.choices))
        if kind == "tool_calls":
            return self._tool_calls_grammar(constraint, not_enforced)
        if kind == "structural_tag":
            return self._structural_tag_grammar(constraint, not_enforced)
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def _lark(self, constraint: Constraint) -> str:
        """Lark passes unchanged; EBNF (GBNF's `root ::= ...`) is translated by llguidance."""
        syntax = constraint.grammar_syntax or "auto"
        if syntax == "lark" or (syntax == "auto" and "::=" not in constraint.spec):
            return constraint.spec
        try:
            return any_to_lark(constraint.spec)
        except Exception as e:  # its translator raises whatever its parser met
            raise GrammarError(f"grammar (EBNF) is not supported by llguidance: {_short(str(e))}") from None

    def _check_repeats(self, pattern: str) -> None:
        large = find_large_repeat(pattern, self.config.max_repeat_count)
        if large is not None:
            raise GrammarError(f"regex repeat count {large[1]} in {large[0]!r} is over this server's "
                               f"max_repeat_count limit of {self.config.max_repeat_count}")

    # -- JSON -------------------------------------------------------------------------------

    def _json_schema(self, constraint: Constraint, not_enforced: list[str]) -> Any:
        """The schema after Formwork's rewrite (grammar/llguidance/prepared_schema.py)."""
        if constraint.kind == "json_object":
            return {"type": "object"}
        prepared = self._prepared_schema(constraint, with_hints=False)
        not_enforced += prepared.notes
        return prepared.schema

    def _prepared_schema(self, constraint: Constraint, with_hints: bool) -> prepared_schema.PreparedSchema:
        """Its Python work may run in the schema worker (GrammarBackend.schema_runner)."""
        return self.schema_runner(prepared_schema.prepare, constraint, self.config, with_hints,
                                  num_chars=len(constraint.spec))

    def _json_grammar(self, constraint: Constraint, schema: Any, not_enforced: list[str]) -> str:
        """Strict: a keyword llguidance does not implement is an error naming it and where it is;
        best effort: it is listed and the rest compiled (llguidance's lenient mode)."""
        options = WHITESPACE_OPTIONS[constraint.json_whitespace]
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        except ValueError as e:
            raise GrammarError(f"{constraint.kind} does not compile: {_short(str(e))}") from None
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.llg_tokenizer,
                                                                         limits=self._limits)
        keywords = [k for m in messages for k in unimplemented_keywords(m)]
        if keywords and constraint.strict:
            shown = "; ".join('unsupported keyword "{}" at {}'.format(*where.split(" at ", 1))
                              for where in keyword_locations(schema, keywords))
            raise UnsupportedError(f"{shown}: llguidance does not enforce it. Send strict=false to compile the "
                                   "schema with it listed as not enforced, or use the xgrammar backend")
        if keywords:  # the strict compile stops at the first; the lenient one warns of each
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults={**options, "lenient": True})
            _, warnings = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.llg_tokenizer,
                                                                      limits=self._limits)
            keywords = list(dict.fromkeys(keywords + [k for w in warnings for k in unimplemented_keywords(w)]))
            not_enforced += keyword_locations(schema, keywords)
        elif is_error and "not supported" in messages[0]:  # a feature (overlapping oneOf), not a bad schema
            raise UnsupportedError(f"{constraint.kind} is not enforced by llguidance: {_short(messages[0])}")
        elif is_error:
            raise GrammarError(f"{constraint.kind} does not compile: {_short(messages[0])}")
        return grammar

    # -- tool calls -------------------------------------------------------------------------

    def _tool_calls_grammar(self, constraint: Constraint, not_enforced: list[str]) -> str:
        """The calls as the tool-call format both backends build (grammar/chat/tool_call_format.py),
        written as a structural tag's Lark; each allowed tool's arguments compiled as a json_schema
        constraint with the same options, named by the tool on error."""
        try:
            spec = ToolCalls.from_spec(constraint.spec)
        except ValueError as e:
            raise GrammarError(str(e)) from None
        contents: dict[str, str] = {}
        arguments = tool_arguments(spec, constraint, lambda content, where, note: self._content_ref(
            content, where, note, contents, not_enforced), not_enforced)
        answer = None
        if spec.answer is not None:  # a structural tag's own tree (its tags may join the calls'), else a grammar
            checked = answer_constraint(constraint, spec.answer, self.config)
            answer = (self._structural_tag_format(checked, contents, not_enforced) if checked.kind == "structural_tag"
                      else _content_ref_of(self._grammar(checked, not_enforced), contents))
        try:
            lark = structural_lark(tool_calls_format(spec, arguments, answer))
        except UnsupportedError as e:
            raise UnsupportedError(f"tool_calls {e}") from None
        return _compose(lark, contents)

    # -- structural tags ---------------------------------------------------------------------

    def _structural_tag_grammar(self, constraint: Constraint, not_enforced: list[str]) -> str:
        """The tag's Lark (grammar/llguidance/structural_lark.py) over its contents, each compiled
        as a constraint of its kind with the tag's options, named by its path on error."""
        contents: dict[str, str] = {}
        format_ = self._structural_tag_format(constraint, contents, not_enforced)
        try:
            lark = structural_lark(format_)
        except UnsupportedError as e:
            raise UnsupportedError(f"structural_tag {e}") from None
        return _compose(lark, contents)

    def _structural_tag_format(self, constraint: Constraint, contents: dict[str, str],
                               not_enforced: list[str]) -> dict:
        """The tag's format tree, each content a `ref` leaf to its grammar, added to `contents`."""
        try:
            format_ = parse_structural_tag(constraint.spec)
        except StructuralTagError as e:
            raise GrammarError(f"structural_tag {e}") from None
        older_shape = is_older_shape(constraint.spec)

        def compile_content(leaf: dict, path: str) -> dict:
            field = content_field(path, leaf, older_shape)
            content = content_constraint(constraint, leaf, field, self.config)
            return self._content_ref(content, field, field, contents, not_enforced)
        return map_contents(format_, compile_content)

    def _content_ref(self, content: Constraint, error_label: str, note_label: str, contents: dict[str, str],
                     not_enforced: list[str]) -> dict:
        """A constraint inside a structural format (a tool's arguments, a structural tag's content)
        compiled as it would be on its own and added to `contents`; its `ref` leaf. An error starts
        with `error_label` (an unsupported keyword stays UnsupportedError), a note with `note_label`."""
        notes: list[str] = []
        try:
            check_limits(content, self.config.max_spec_bytes, self.config.max_schema_depth)
            grammar = self._grammar(content, notes)
        except GrammarError as e:
            raise type(e)(f"{error_label}: {e}") from None
        not_enforced.extend(f"{note_label}: {note}" for note in notes)
        return _content_ref_of(grammar, contents)

    # -- the rest of the ABC ----------------------------------------------------------------

    def _probe_first_fill(self, kind: str, template: llg.LLMatcher) -> None:
        """The first mask, here on the compile thread: a grammar llguidance cannot start (its
        parser limits) fails its own compile rather than a step."""
        probe = template.deep_copy()
        bitmask = allocate_token_bitmask(1, self.vocab_size)
        fill_next_token_bitmask(probe, bitmask, 0)
        if probe.is_error():
            raise GrammarError(f"{kind}: its first token mask failed: {_short(probe.get_error())}")

    def make_grammar(self, compiled: CompiledGrammar) -> LLGuidanceGrammar:
        if not isinstance(compiled, LLGuidanceCompiled):
            raise TypeError(f"expected a grammar compiled by LLGuidanceBackend, got {type(compiled).__name__}")
        return LLGuidanceGrammar(compiled, self.forced_text, self.stop_token_ids, self.vocab_size,
                                 self.config.max_forced_bytes, self.char_tokens, self.llg_tokenizer)

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return allocate_token_bitmask(num_rows, self.vocab_size)

    def text_encoder(self) -> Callable[[str], list[int]] | None:
        return self.forced_text.encode if self.forced_text.enabled else None


def _content_ref_of(grammar: str, contents: dict[str, str]) -> dict:
    """`grammar` added to `contents` under a new name; the format leaf that refers to it."""
    name = f"content_{len(contents)}"
    contents[name] = grammar
    return {"type": "ref", "name": name}


def _compose(main_lark: str, named: dict[str, str]) -> str:
    """One llguidance grammar of a Lark grammar that refers to others as `@name`; `named`: name ->
    a grammar as llguidance's grammar_from_* or _compose wrote it (its JSON form, or plain Lark).
    A composed one brings its own named parts along; their names must not meet `named`'s."""
    grammars: list[dict[str, Any]] = [{"lark_grammar": main_lark}]
    for name, text in named.items():
        inner = json.loads(text)["grammars"] if text.lstrip().startswith("{") else [{"lark_grammar": text}]
        grammars += [{**inner[0], "name": name}, *inner[1:]]
    names = [g["name"] for g in grammars[1:]]
    if len(set(names)) != len(names):
        raise GrammarError(f"grammar parts share a name ({names}); this combination is not supported")
    return json.dumps({"grammars": grammars})


def _short(message: str) -> str:
    """llguidance's message up to its state dump, at most _MAX_ERROR_CHARS."""
    message = message.split("\n<state>", 1)[0].strip()
    return message if len(message) <= _MAX_ERROR_CHARS else message[:_MAX_ERROR_CHARS] + "..."
