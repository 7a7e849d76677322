"""The shape a request asks its output to have: the one type every layer shares.

It crosses the process boundary inside `EngineCoreRequest`, so it is a msgspec struct
(array_like, omit_defaults): compact on the wire, and an unset field costs nothing.
"""
from __future__ import annotations

import json
from dataclasses import replace

import msgspec

from grammar.chat.structural_tag import parse_structural_tag
from grammar.chat.tool_calls import ToolCalls
from grammar.config import GRAMMAR_BACKENDS

# Whitespace between JSON tokens: "compact" {"a":1,"b":2}; "spaced" {"a": 1, "b": 2} (what models
# write most); "bounded" any whitespace, at most BOUNDED_JSON_WHITESPACE characters per gap (no
# runaway newlines); "any" free whitespace (unbounded: a model can loop on it until max_tokens).
JSON_WHITESPACE_MODES = ("compact", "spaced", "bounded", "any")
BOUNDED_JSON_WHITESPACE = 2
# the syntaxes of a kind "grammar" spec ("auto": told apart by the text)
GRAMMAR_SYNTAXES = ("auto", "ebnf", "lark")
CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "grammar", "choice", "structural_tag")
# plus the kind the front end builds from a request's tools (grammar/chat/tool_calls.py)
ENGINE_KINDS = (*CONSTRAINT_KINDS, "tool_calls")
# the kinds whose output is or holds JSON, so that the JSON whitespace mode applies to them
JSON_KINDS = ("json_schema", "json_object", "tool_calls", "structural_tag")
# the whitespace mode of JSON a constraint does not name (JSON_WHITESPACE_MODES says what each allows)
DEFAULT_JSON_WHITESPACE = "bounded"
# the kinds a think section's own constraint may be (its text, not tags or calls)
THINK_KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")


class Constraint(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """The shape the output must have.

    kind: one of ENGINE_KINDS.
    spec: JSON Schema text (json_schema), a regex (regex), a grammar in xgrammar's EBNF or in Lark
          (grammar), a structural tag's JSON text (structural_tag, grammar/chat/structural_tag.py), a
          grammar.chat.tool_calls.ToolCalls spec (tool_calls); empty for json_object and choice.
    choices: the allowed outputs, for kind "choice".
    strict: a JSON-Schema keyword the backend cannot enforce is an error (True) or is reported in
            the output as not enforced (False, best effort); the same for the schemas inside a
            structural tag or the tools' parameters.
    any_whitespace: allow free whitespace between JSON tokens (the same as whitespace="any").
    jump_forward: append text the grammar forces without sampling it (None: the engine's default).
    close_early: close the output before max_tokens or the context runs out, and (JSON kinds) when
                 it loops (None: the engine's default); the output then says it was closed.
    whitespace: one of JSON_WHITESPACE_MODES for the JSON kinds ("": DEFAULT_JSON_WHITESPACE).
    grammar_syntax: "ebnf" or "lark" for kind "grammar" ("" or "auto": told apart by the text).
    think_end: non-empty: the output first thinks freely until this marker (grammar/chat/reasoning.py),
               and the constraint applies after it.
    think_budget: the most tokens of thinking (0: no limit); at the limit the marker is forced.
    think: the think section's own constraint (one of THINK_KINDS; None: free thinking): the text
           between the start marker (which the output may write or the prompt may already hold)
           and `think_end` must match it. A grammar's forced end marker would cut it short, so it
           excludes think_budget: bound the think constraint itself instead.
    think_start: the start marker the output may write before a constrained think section.
    grammar_backend: one of GRAMMAR_BACKENDS ("": the engine's GrammarConfig.grammar_backend).
    """

    kind: str
    spec: str = ""
    choices: list[str] = []
    strict: bool = True
    any_whitespace: bool = False
    jump_forward: bool | None = None
    whitespace: str = ""
    grammar_syntax: str = ""
    think_end: str = ""
    think_budget: int = 0
    close_early: bool | None = None
    grammar_backend: str = ""
    think: Constraint | None = None
    think_start: str = ""

    @property
    def json_whitespace(self) -> str:
        """The whitespace mode JSON is compiled with."""
        return "any" if self.any_whitespace else (self.whitespace or DEFAULT_JSON_WHITESPACE)

    def validate(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}; expected one of {', '.join(ENGINE_KINDS)}")
        if self.whitespace and self.whitespace not in JSON_WHITESPACE_MODES:
            raise ValueError(f"unknown whitespace mode {self.whitespace!r}; expected one of "
                             f"{', '.join(JSON_WHITESPACE_MODES)}")
        if self.grammar_syntax and self.grammar_syntax not in GRAMMAR_SYNTAXES:
            raise ValueError(f"unknown grammar syntax {self.grammar_syntax!r}; expected one of "
                             f"{', '.join(GRAMMAR_SYNTAXES)}")
        if self.kind == "choice":
            if not self.choices:
                raise ValueError("a choice constraint needs at least one choice")
            if any(not c for c in self.choices):
                raise ValueError("choices must be non-empty strings")
        elif self.kind in ("json_schema", "regex", "grammar", "tool_calls", "structural_tag") and not self.spec.strip():
            raise ValueError(f"a {self.kind} constraint needs a non-empty spec")
        if self.grammar_backend and self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"unknown grammar backend {self.grammar_backend!r}; expected one of "
                             f"{', '.join(GRAMMAR_BACKENDS)}")
        if self.think_budget < 0:
            raise ValueError(f"think_budget must be >= 0 (0: no limit), got {self.think_budget}")
        if self.think_budget and not self.think_end:
            raise ValueError("think_budget needs think_end (the marker that ends thinking)")
        if self.think is not None:
            self._validate_think(self.think)
        if self.kind == "tool_calls":
            ToolCalls.from_spec(self.spec)
        if self.kind == "structural_tag":
            parse_structural_tag(self.spec)
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
            except RecursionError:
                raise ValueError("json_schema is nested too deeply to parse") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("json_schema must be a JSON object (or a boolean schema)")

    def _validate_think(self, think: Constraint) -> None:
        if not self.think_end:
            raise ValueError("a think constraint needs think_end (the marker that ends thinking)")
        if self.think_budget:
            raise ValueError("a think constraint cannot be combined with a think budget: a token budget is "
                             "enforced only over free text, and the end marker forced at the budget would cut "
                             "the think text off mid-grammar, unmatched; bound the think constraint itself, "
                             "e.g. a regex with a count")
        if think.kind not in THINK_KINDS:
            raise ValueError(f"a think constraint's kind must be one of {', '.join(THINK_KINDS)}, got {think.kind!r}")
        if think.think_end or think.think is not None:
            raise ValueError("a think constraint cannot have a think section of its own")
        try:
            think.validate()
        except ValueError as e:
            raise ValueError(f"think constraint: {e}") from None

    @property
    def cache_key(self) -> tuple:
        """(kind, canonical spec, options): equal keys compile to the same grammar."""
        spec = self.spec
        if self.kind in ("json_schema", "tool_calls", "structural_tag"):
            # whitespace is canonicalized, key order is not: properties are generated in the
            # order the schema declares them, so a reordered schema is a different grammar
            spec = json.dumps(json.loads(spec), separators=(",", ":"))
        whitespace = self.json_whitespace if self.kind in JSON_KINDS else ""
        syntax = (self.grammar_syntax or "auto") if self.kind == "grammar" else ""
        think = self.think.cache_key if self.think is not None else None
        return (self.kind, spec, tuple(self.choices), self.strict, whitespace, syntax, self.think_end,
                self.think_budget, self.grammar_backend, think, self.think_start if think else "")


# the output after a think section, for a request with a reasoning budget and no constraint of its own
ANY_TEXT = r"[\s\S]*"


def with_tool_calls(spec: ToolCalls, constraint: Constraint | None) -> Constraint:
    """The constraint of a request offering `spec`'s tools beside its own `constraint` (or None).

    With choice auto, a text answer follows `constraint` (spec.answer); with required / named the
    output is only calls, so `constraint`'s shape is moot. Its options (strict, whitespace, ...)
    apply to the calls' arguments either way."""
    if constraint is not None and spec.choice == "auto":
        spec = replace(spec, answer={"kind": constraint.kind, "spec": constraint.spec,
                                     "choices": list(constraint.choices)})
    if constraint is None:
        return Constraint(kind="tool_calls", spec=spec.to_spec())
    return msgspec.structs.replace(constraint, kind="tool_calls", spec=spec.to_spec(), choices=[])


def after_thinking(constraint: Constraint | None, think_end: str, budget: int, think: Constraint | None = None,
                   think_start: str = "") -> Constraint | None:
    """`constraint` applied after a think section ending in `think_end` (at most `budget` tokens,
    0: no limit; its text matching `think`, if given, after an optional `think_start`); without a
    constraint, the budget or the think constraint alone needs one (any text after the marker)."""
    if constraint is None and (budget or think is not None):
        constraint = Constraint(kind="regex", spec=ANY_TEXT)
    if constraint is None:
        return None
    return msgspec.structs.replace(constraint, think_end=think_end, think_budget=budget, think=think,
                                   think_start=think_start if think is not None else "")
