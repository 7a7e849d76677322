"""Measure which JSON-Schema keywords the grammar backend enforces, and audit grammar/xgrammar/schema_gaps.py.

    OMP_WAIT_POLICY=PASSIVE python -m bench.keyword_survey [--suite DIR] [--only KEYWORD]

For every group of the official JSON-Schema test suite (draft 2020-12: a schema plus instances
marked valid or invalid) and for our own probes, the schema is compiled through the real backend
(best-effort mode, so the checker's findings come back as `not_enforced`) and each instance's
compact JSON is fed through a fresh matcher as the tokenizer would encode it; it is accepted if
every token and then a stop token are accepted.

Attribution: an invalid instance that is rejected counts as evidence for the keyword only if the
same schema with the keyword stripped accepts it (otherwise something else rejected it). Each
suite schema is measured as written and, when its root declares no "type", with the type the
keyword applies to added ("typed"; instances of other types then count as invalid), because
xgrammar ignores typed keywords in untyped schemas.

The audit: an accepted invalid instance in a group where the checker reported nothing is a
silent under-constraint. The run fails (exit 1) if there is any.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.datasets import TEST_SUITE_DIR
from grammar.backend import GrammarBackend, GrammarError
from grammar.json_schema.walk import iter_subschemas

DEFAULT_SUITE = TEST_SUITE_DIR  # the suite's draft 2020-12 files carried in the repository (bench/data/README.md)

# suite file -> the keywords it tests (stripped for attribution)
_STRIP = {
    "anchor": ("$anchor", "$ref"), "defs": ("$defs",), "dynamicRef": ("$dynamicRef", "$dynamicAnchor"),
    "if-then-else": ("if", "then", "else"), "infinite-loop-detection": ("$ref",), "ref": ("$ref",),
    "refRemote": ("$ref",), "content": ("contentEncoding", "contentMediaType", "contentSchema"),
    "vocabulary": ("$vocabulary",), "boolean_schema": (),
}
# keyword -> the instance type it constrains, for the "typed" variant
_IMPLIED_TYPE = {
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
    **dict.fromkeys(("minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains", "items",
                     "prefixItems", "unevaluatedItems"), "array"),
    **dict.fromkeys(("minProperties", "maxProperties", "required", "properties", "patternProperties",
                     "additionalProperties", "propertyNames", "dependentRequired", "dependentSchemas",
                     "unevaluatedProperties"), "object"),
}

# Our own probes: (row label, keywords to strip, schema, [(instance, valid)]).
_S = {"type": "string"}
PROBES: list[tuple[str, tuple[str, ...], Any, list[tuple[Any, bool]]]] = [
    ("minLength + pattern", ("minLength",), {**_S, "pattern": "^[a-z]+$", "minLength": 3},
     [("abc", True), ("ab", False)]),
    ("maxLength + format", ("maxLength",), {**_S, "format": "date", "maxLength": 5}, [("2020-01-01", False)]),
    ("multipleOf (number)", ("multipleOf",), {"type": "number", "multipleOf": 1.5}, [(3, True), (4, False)]),
    ("multipleOf (integer)", ("multipleOf",), {"type": "integer", "multipleOf": 3}, [(6, True), (4, False)]),
    ("enum + type", ("type",), {"type": "integer", "enum": [1, "x"]}, [(1, True), ("x", False)]),
    ("enum + minLength", ("minLength",), {**_S, "enum": ["a", "abc"], "minLength": 2}, [("abc", True), ("a", False)]),
    ("$ref + sibling", ("minimum",), {"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "minimum": 5},
     [(6, True), (1, False)]),
    ("anyOf + sibling", ("minimum",), {"type": "integer", "minimum": 0, "anyOf": [
        {"type": "integer", "maximum": 2}, {"type": "integer", "minimum": 4}]}, [(1, True), (-1, False)]),
    ("allOf (two)", ("allOf",), {"allOf": [{"type": "integer", "minimum": 2}, {"type": "integer", "maximum": 5}]},
     [(3, True), (7, False)]),
    ("required (undeclared)", ("required",), {"type": "object", "required": ["a"]}, [({"a": 1}, True), ({}, False)]),
    ("required (declared)", ("required",), {"type": "object", "properties": {"a": {}}, "required": ["a"]},
     [({"a": 1}, True), ({}, False)]),
    ("oneOf (disjoint)", ("oneOf",), {"oneOf": [{"type": "integer"}, {"type": "string"}]}, [(1, True), (None, False)]),
    ("oneOf (overlapping)", ("oneOf",), {"type": "object", "properties": {"v": {"oneOf": [
        {"type": "integer"}, {"type": "number"}]}}}, [({"v": 1.5}, True), ({"v": 1}, False)]),
    ("pattern (search vs full match)", ("pattern",), {**_S, "pattern": "b"},
     [("b", True), ("abc", True), ("x", False)]),
    ("uniqueItems (typed, items)", ("uniqueItems",),
     {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [([1, 2], True), ([1, 1], False)]),
    ("maxProperties (no properties)", ("maxProperties",), {"type": "object", "maxProperties": 1},
     [({"a": 1}, True), ({"a": 1, "b": 2}, False)]),
    ("minItems (no items)", ("minItems",), {"type": "array", "minItems": 1}, [([1], True), ([], False)]),
    ("unevaluatedProperties + additionalProperties", ("unevaluatedProperties",), {
        "type": "object", "properties": {"a": {}}, "additionalProperties": True, "unevaluatedProperties": False},
     [({"a": 1}, True), ({"a": 1, "b": 1}, False)]),
]
_BAD_FORMAT_VALUE = {"regex": "(", "uri-template": "{", "json-pointer": "a", "relative-json-pointer": "/a"}
for _fmt, _good in [("date", "2020-01-31"), ("date-time", "2020-01-31T12:00:00Z"), ("time", "12:00:00Z"),
                    ("duration", "P1D"), ("email", "a@b.co"), ("idn-email", "a@b.co"), ("hostname", "a.b"),
                    ("idn-hostname", "a.b"), ("ipv4", "1.2.3.4"), ("ipv6", "::1"), ("uri", "http://a.b/c"),
                    ("uri-reference", "/c"), ("iri", "http://a.b/c"), ("iri-reference", "/c"),
                    ("uuid", "123e4567-e89b-12d3-a456-426614174000"), ("uri-template", "/a/{b}"),
                    ("json-pointer", "/a/b"), ("relative-json-pointer", "1/a"), ("regex", "a+")]:
    PROBES.append((f"format: {_fmt}", ("format",), {**_S, "format": _fmt},
                   [(_good, True), (_BAD_FORMAT_VALUE.get(_fmt, "x y"), False)]))


@dataclass
class Tally:
    """Counts for one (keyword, variant) row."""

    groups: int = 0
    compile_errors: int = 0
    valid_accepted: int = 0
    valid_rejected: int = 0  # over-constraint: narrower than the schema
    enforced: int = 0  # invalid, rejected, and accepted once the keyword is stripped
    inconclusive: int = 0  # invalid, rejected, but also rejected without the keyword
    missed: int = 0  # invalid and accepted: under-constraint
    flagged_missed: int = 0  # missed, in a group where the checker reported something
    silent: int = 0  # missed, in a group where the checker reported nothing
    examples: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.missed and self.enforced:
            return "partial"
        if self.missed:
            return "no"
        if self.enforced:
            return "yes"
        return "n/a"


class Oracle:
    """Does the backend's grammar for `schema` accept `instance`? Compiles are memoised."""

    def __init__(self, backend: GrammarBackend, encode: Callable[[str], list[int]], stop_token_id: int) -> None:
        self._backend = backend
        self._encode = encode
        self._stop_token_id = stop_token_id
        self._compiled: dict[str, Any] = {}

    def compile(self, schema: Any):
        """(compiled grammar, not_enforced) or (None, error message)."""
        from grammar.constraint import Constraint

        text = json.dumps(schema, sort_keys=True)
        if text not in self._compiled:
            try:
                compiled = self._backend.compile(Constraint("json_schema", text, strict=False))
                self._compiled[text] = (compiled, list(compiled.not_enforced))
            except GrammarError as e:
                self._compiled[text] = (None, str(e))
        return self._compiled[text]

    def accepts(self, schema: Any, instance: Any) -> bool | None:
        compiled, _ = self.compile(schema)
        if compiled is None:
            return None
        grammar = self._backend.make_grammar(compiled)
        token_ids = self._encode(json.dumps(instance, separators=(",", ":"), ensure_ascii=False))
        return grammar.accept_tokens(token_ids) and grammar.accept_tokens([self._stop_token_id])


def strip(schema: Any, keywords: tuple[str, ...]) -> Any:
    stripped = copy.deepcopy(schema)
    for _, node, _ in iter_subschemas(stripped):
        if isinstance(node, dict):
            for keyword in keywords:
                node.pop(keyword, None)
    return stripped


def _conforms(value: Any, wanted: str) -> bool:
    if wanted == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted == "string":
        return isinstance(value, str)
    return isinstance(value, list) if wanted == "array" else isinstance(value, dict)


def measure_group(oracle: Oracle, tally: Tally, schema: Any, keywords: tuple[str, ...],
                  instances: list[tuple[Any, bool]], label: str) -> None:
    tally.groups += 1
    compiled, info = oracle.compile(schema)
    if compiled is None:
        tally.compile_errors += 1
        return
    flagged = bool(info)
    stripped = strip(schema, keywords) if keywords else None
    for instance, valid in instances:
        accepted = oracle.accepts(schema, instance)
        if valid:
            tally.valid_accepted += accepted
            tally.valid_rejected += not accepted
        elif accepted:
            tally.missed += 1
            tally.flagged_missed += flagged
            tally.silent += not flagged
            if not flagged and len(tally.examples) < 3:
                tally.examples.append(f"{label}: {json.dumps(instance)[:40]}")
        elif stripped is not None and oracle.accepts(stripped, instance):
            tally.enforced += 1
        else:
            tally.inconclusive += 1


def survey(backend: GrammarBackend, encode: Callable[[str], list[int]], stop_token_id: int,
           suite_dir: Path = DEFAULT_SUITE, only: str | None = None) -> dict[tuple[str, str], Tally]:
    """{(keyword, variant): Tally} for the suite files (variants "as written" and "typed") and probes."""
    oracle = Oracle(backend, encode, stop_token_id)
    tallies: dict[tuple[str, str], Tally] = defaultdict(Tally)
    for path in sorted(suite_dir.glob("*.json")):
        name = path.stem
        if only and name != only:
            continue
        keywords = _STRIP.get(name, (name,))
        implied = next((_IMPLIED_TYPE[k] for k in keywords if k in _IMPLIED_TYPE), None)
        for group in json.loads(path.read_text()):
            schema = group["schema"]
            instances = [(t["data"], t["valid"]) for t in group["tests"]]
            measure_group(oracle, tallies[(name, "as written")], schema, keywords, instances, group["description"])
            if implied and isinstance(schema, dict) and "type" not in schema:
                typed = {**schema, "type": implied}
                typed_instances = [(data, valid and _conforms(data, implied)) for data, valid in instances]
                measure_group(oracle, tallies[(name, "typed")], typed, keywords, typed_instances, group["description"])
    if not only:
        for label, keywords, schema, instances in PROBES:
            measure_group(oracle, tallies[(label, "probe")], schema, keywords, instances, label)
    return tallies


def markdown(tallies: dict[tuple[str, str], Tally]) -> str:
    lines = ["| keyword | schemas | enforced | evidence: enforced / missed / inconclusive | valid rejected "
             "| compile errors | missed but flagged | silent |",
             "|---|---|---|---|---|---|---|---|"]
    for (name, variant), t in tallies.items():
        lines.append(f"| {name} ({variant}) | {t.groups} | {t.verdict} | {t.enforced} / {t.missed} / "
                     f"{t.inconclusive} | {t.valid_rejected} of {t.valid_accepted + t.valid_rejected} "
                     f"| {t.compile_errors} | {t.flagged_missed} | {t.silent} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    parser.add_argument("--only", help="one suite file (keyword) only")
    args = parser.parse_args()
    from engine.model_files import resolve_model
    from grammar.xgrammar.backend import XGrammarBackend

    tokenizer_dir = resolve_model(None)
    import transformers

    vocab_size = transformers.AutoConfig.from_pretrained(tokenizer_dir).vocab_size
    backend = XGrammarBackend(str(tokenizer_dir), vocab_size)
    encode = lambda text: backend.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    tallies = survey(backend, encode, backend.stop_token_ids[0], args.suite, args.only)
    print(markdown(tallies))
    silent = [(k, t.examples) for k, t in tallies.items() if t.silent]
    for key, examples in silent:
        print(f"SILENT under-constraint in {key}: {examples}", file=sys.stderr)
    sys.exit(1 if silent else 0)


if __name__ == "__main__":
    main()
