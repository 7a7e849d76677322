"""The machinery behind tests/grammar/test_rewrite_check.py: the schema rewrite never admits what the original forbids.

For a schema that grammar.json_schema.rewrite changes (or with a pattern naming a quote or a
backslash, which xgrammar gets in its JSON-text form, or a number the backend gives a rule of its
own, grammar/xgrammar/decimal_numbers.py), instances are drawn from the compiled grammar of the
rewritten schema (random walks through its matcher, biased towards closing strings and objects),
then mutated (keys dropped and added, values swapped for other types, lengths changed, a quote or
a backslash added). Each is validated with jsonschema against the original and the rewritten
schema, and fed to the grammar:

* looser: the rewritten schema, or (for a schema that compiles in strict mode) the grammar, accepts
  an instance the original rejects. Must be 0. (A best-effort grammar has listed gaps.)
* narrowed: the original accepts an instance the rewritten schema rejects. Allowed, reported.
"""
from __future__ import annotations

import copy
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from grammar.backend import GrammarError
from grammar.constraint import Constraint
from grammar.json_schema.json_text_pattern import names_quote_or_backslash
from grammar.json_schema.rewrite import rewrite
from grammar.xgrammar.schema_gaps import ENFORCED_FORMATS
from grammar.json_schema.walk import iter_subschemas
from grammar.regex.pieces import regex_pieces
from grammar.xgrammar import decimal_numbers


@dataclass
class CheckResult:
    num_schemas: int = 0
    num_rewritten: int = 0
    num_strict: int = 0  # of those, compiled in strict mode (their grammar is judged too)
    num_instances: int = 0
    num_sampled: int = 0
    looser: list[str] = field(default_factory=list)  # "id: instance" (must stay empty)
    num_narrowed: int = 0  # instances the original accepts and the rewrite rejects
    schemas_narrowed: int = 0
    unverifiable: Counter = field(default_factory=Counter)  # why a schema could not be checked
    rules: Counter = field(default_factory=Counter)


def validator(schema: Any):
    """jsonschema's validator for the schema's draft, with ECMA-262's "$" (the end, not also
    before a final line break as in Python's re), which is what JSON Schema means, and
    `multipleOf` on the numbers' decimal text (JSON Schema's mathematical multiple: jsonschema's
    float division finds 0.07 no multiple of 0.01)."""
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)

    def pattern(validator, pattern, instance, schema):
        if validator.is_type(instance, "string") and not re.search(ecma_dollar(pattern), instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")

    def multiple_of(validator, multiple, instance, schema):
        if validator.is_type(instance, "number") and not is_multiple(instance, multiple):
            yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {multiple!r}")

    return jsonschema.validators.extend(cls, {"pattern": pattern, "multipleOf": multiple_of})(schema)


def is_multiple(value: int | float, multiple: int | float) -> bool:
    """Whether `value` is a whole multiple of `multiple`, both read as the decimals they print as."""
    if not math.isfinite(value):
        return False
    quotient = Fraction(Decimal(repr(value))) / Fraction(Decimal(repr(multiple)))
    return quotient.denominator == 1


def ecma_dollar(pattern: str) -> str:
    """`pattern` with each "$" anchor (outside classes, unescaped) written as Python's \\Z."""
    return "".join("\\Z" if piece == "$" and not in_class else piece for _, piece, in_class in regex_pieces(pattern))


def mutations(value: Any, rng: random.Random, limit: int = 24) -> list[Any]:
    """Variants of `value` one edit away: the edits a too-loose grammar would let through."""
    out: list[Any] = []
    paths: list[list] = []

    def walk(node: Any, path: list) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, [*path, k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, [*path, i])

    walk(value, [])
    for path in rng.sample(paths, min(len(paths), limit)):
        for edit in _edits(_get(value, path), rng):
            out.append(_set(value, path, edit))
    rng.shuffle(out)
    return out[:limit * 3]


def _edits(node: Any, rng: random.Random) -> list[Any]:
    swaps = [None, True, 0, -1, 2 ** 70, 0.5, "", "x" * 40, [], {}]
    edits = rng.sample(swaps, 3)
    if isinstance(node, dict):
        for key in list(node)[:3]:
            edits.append({k: v for k, v in node.items() if k != key})
        edits.append({**node, "zz_extra": 1})
    elif isinstance(node, list):
        edits += [[], node + node[:1], node + [None], node[:-1]]
    elif isinstance(node, str):
        edits += [node * 3, node[:-1], node + "\n", node.upper(), node + '"', "\\" + node]
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        edits += [node + 1, node - 1, node + 0.5, -node, node * 1000]
    return edits


def _get(value: Any, path: list) -> Any:
    for token in path:
        value = value[token]
    return value


def _set(value: Any, path: list, new: Any) -> Any:
    if not path:
        return new
    out = copy.deepcopy(value)
    _get(out, path[:-1])[path[-1]] = new
    return out


def _spells_escapes(schema: Any) -> bool:
    """Whether a pattern of the schema is handed to xgrammar rewritten for the JSON text (it names
    a quote or a backslash): its grammar is checked even where the rewrite changes nothing."""
    return any(isinstance(node, dict) and isinstance(node.get("pattern"), str)
               and names_quote_or_backslash(node["pattern"]) for _, node, _ in iter_subschemas(schema))


class GrammarSampler:
    """Random walks through a compiled grammar, preferring tokens that close a string or value."""

    def __init__(self, backend) -> None:
        import numpy as np

        self.np = np
        self.backend = backend
        texts = [backend.tokenizer.decode([i]) for i in range(len(backend.tokenizer))]
        self.closing = np.array([any(c in t for c in '"]}') for t in texts] + [False] * (backend.vocab_size - len(texts)))
        self.bitmask = backend.allocate_bitmask(1)

    def sample(self, compiled, rng: random.Random, max_tokens: int = 300) -> str | None:
        grammar = self.backend.make_grammar(compiled)
        stop = set(self.backend.stop_token_ids)
        token_ids: list[int] = []
        for _ in range(max_tokens):
            if grammar.is_terminated():
                return self.backend.tokenizer.decode(token_ids)
            grammar.fill_bitmask(self.bitmask, 0)
            bits = self.np.unpackbits(self.bitmask.numpy().view(self.np.uint8), bitorder="little")
            allowed = self.np.flatnonzero(bits[:self.backend.vocab_size])
            if not len(allowed):
                return None
            stops = [t for t in allowed if t in stop]
            closing = allowed[self.closing[allowed]]
            if stops and rng.random() < 0.7:
                return self.backend.tokenizer.decode(token_ids)
            pool = closing if len(closing) and rng.random() < 0.5 else allowed
            token_id = int(pool[rng.randrange(len(pool))])
            if token_id in stop:
                return self.backend.tokenizer.decode(token_ids)
            if not grammar.accept_tokens([token_id]):
                return None
            token_ids.append(token_id)
        return None


def accepted_by_grammar(backend, compiled, text: str) -> bool:
    grammar = backend.make_grammar(compiled)
    ids = backend.tokenizer.encode(text, add_special_tokens=False)
    return grammar.accept_tokens(ids) and grammar.accept_tokens([backend.stop_token_ids[0]])


def check_schema(backend, sampler: GrammarSampler, sid: str, schema: Any, result: CheckResult,
                 rng: random.Random, num_samples: int) -> None:
    result.num_schemas += 1
    try:
        rewritten = rewrite(schema, ENFORCED_FORMATS)
    except GrammarError as e:
        result.unverifiable[f"rewrite refused: {str(e)[:50]}"] += 1
        return
    if rewritten.schema == schema and not _spells_escapes(schema) and not decimal_numbers.mark(schema)[1]:
        return
    result.num_rewritten += 1
    result.rules.update(rewritten.rules)
    try:
        original, new = validator(schema), validator(rewritten.schema)
        spec = json.dumps(schema)
        try:
            compiled, strict = backend.compile(Constraint(kind="json_schema", spec=spec)), True
        except GrammarError:  # best effort: its grammar has listed gaps, so only the schema is judged
            compiled, strict = backend.compile(Constraint(kind="json_schema", spec=spec, strict=False)), False
    except GrammarError as e:
        result.unverifiable[f"does not compile: {str(e)[:40]}"] += 1
        return
    result.num_strict += strict
    samples = [s for s in (sampler.sample(compiled, rng) for _ in range(num_samples)) if s is not None]
    instances: list[tuple[Any, bool]] = []  # (instance, sampled from the grammar)
    for text in samples:
        try:
            value = json.loads(text)
        except ValueError:
            result.looser.append(f"{sid}: the grammar produced non-JSON {text[:80]!r}")
            continue
        instances.append((value, True))
        instances += [(m, False) for m in mutations(value, rng)]
    instances += [(v, False) for v in (None, True, 0, 1.5, "", "a", [], {}, [None], {"a": 1})]
    narrowed = 0
    for value, sampled in instances:
        try:
            ok_original, ok_new = original.is_valid(value), new.is_valid(value)
        except Exception as e:  # a pattern Python's re cannot read, an unresolvable $ref...
            result.unverifiable[f"jsonschema: {type(e).__name__}"] += 1
            return
        result.num_instances += 1
        result.num_sampled += sampled
        by_grammar = strict and (sampled or accepted_by_grammar(backend, compiled, json.dumps(value, separators=(",", ":"))))
        if not ok_original and (ok_new or by_grammar):
            result.looser.append(f"{sid}: {'grammar' if by_grammar else 'schema'} accepts "
                                 f"{json.dumps(value)[:160]}")
        narrowed += ok_original and not ok_new
    result.num_narrowed += narrowed
    result.schemas_narrowed += narrowed > 0


def report(result: CheckResult) -> str:
    """The figures of a run, as docs/constraints-keywords.md quotes them."""
    lines = [f"schemas {result.num_schemas}, rewritten {result.num_rewritten} ({result.num_strict} strict), "
             f"instances {result.num_instances} ({result.num_sampled} sampled from the grammar)",
             f"looser (must be 0): {len(result.looser)}"]
    for sid, count in Counter(line.split(": ")[0] for line in result.looser).most_common():
        lines.append(f"    LOOSER {count} x {sid}: {next(x for x in result.looser if x.startswith(sid + ': '))[:240]}")
    lines.append(f"narrowed: {result.num_narrowed} instances in {result.schemas_narrowed} schemas")
    lines.append("rules applied: " + ", ".join(f"{k} {v}" for k, v in result.rules.most_common()))
    lines += [f"    not checked: {count} x {reason}" for reason, count in result.unverifiable.most_common()]
    return "\n".join(lines)
