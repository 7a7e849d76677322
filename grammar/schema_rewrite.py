"""Rewrite a JSON schema into an equivalent or narrower one that xgrammar enforces fully.

Runs before schema_check's strictness check. Many schemas are refused not because a keyword
cannot be enforced but because xgrammar cannot *read* the form it is written in (an `allOf`, a
keyword beside `$ref`, `required` in a schema without "type"). Each rule below rewrites one such
form; its docstring says whether it keeps the set of valid instances (exact) or narrows it.
No rule ever widens it. A rule that does not apply, or cannot be applied exactly enough, leaves
the node as it was, so the checker still reports it. Narrowing rules run only where narrowing a
subschema narrows the whole schema: not under `not`, `if`, `contains` or a oneOf's branches
(where a narrower branch can make an instance match one branch instead of two).

Pure JSON -> JSON; the input is not modified. Bounded: the output may grow to at most
MAX_GROWTH times the input (or MAX_MIN_BYTES), and the walk visits at most MAX_VISITS nodes;
past either a GrammarError names the limit, never a hang. The pass repeats until nothing
changes (at most MAX_PASSES), because one rule's output can be another's input.
"""
from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grammar.backend import GrammarError
from grammar.length_pattern import fold_lengths
from grammar.one_of import MAX_ALTERNATIVES, disjoint, instance_types, one_of_by_required
from grammar.schema_check import ASSERTIONS, SUPPORTED_FORMATS, iter_subschemas, pointer_join, resolve_pointer
from grammar.schema_merge import (TYPES, CannotMerge, EmptyIntersection, copy_json, declared_types, json_equal,
                                  json_type, merge, type_value)

MAX_PASSES = 4
MAX_VISITS = 200_000
MAX_GROWTH = 8
MAX_MIN_BYTES = 256 * 1024
MAX_BRANCHES = MAX_ALTERNATIVES  # dependencies expanded into at most this many alternatives
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# keyword -> the instance type it describes, for type inference
_FAMILIES = {
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
    **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"), "array"),
    **dict.fromkeys(("properties", "additionalProperties", "required", "minProperties", "maxProperties",
                     "patternProperties", "propertyNames", "dependentRequired", "dependencies"), "object"),
}
_NON_MONOTONE = ("not", "if", "contains", "oneOf")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SINGLES = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
            "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


@dataclass
class Rewritten:
    """A rewrite's result: the schema, what fired, and notes for the caller's not_enforced list."""

    schema: Any
    rules: Counter = field(default_factory=Counter)  # rule name -> times applied
    narrowed: list[str] = field(default_factory=list)  # "rule at pointer" for each narrowing
    notes: list[str] = field(default_factory=list)  # e.g. format names taken as annotations


def rewrite(schema: Any) -> Rewritten:
    """The schema rewritten into forms xgrammar enforces; raises GrammarError on an empty
    `allOf` intersection or a blow-up past the limits (see the module docstring)."""
    limit = max(MAX_MIN_BYTES, MAX_GROWTH * len(json.dumps(schema)))
    out = Rewritten(copy_json(schema))
    for _ in range(MAX_PASSES):
        before = json.dumps(out.schema, sort_keys=True)
        out.schema = _Pass(out).run(out.schema)
        after = json.dumps(out.schema, sort_keys=True)
        if len(after) > limit:
            raise GrammarError(f"rewriting the schema for the grammar would make it {len(after)} bytes, over "
                               f"its limit of {limit}; simplify its allOf/$ref/dependencies")
        if after == before:
            break
    out.notes = list(dict.fromkeys(out.notes))
    out.narrowed = list(dict.fromkeys(out.narrowed))
    return out


def _asserting(node: dict, *exclude: str) -> dict:
    return {k: v for k, v in node.items() if k in ASSERTIONS and k not in exclude}


def _kept(node: dict, *exclude: str) -> dict:
    """What stays on the node when its assertions move elsewhere: annotations, $defs, x-..."""
    return {k: v for k, v in node.items() if k not in ASSERTIONS and k not in exclude}


class _Pass:
    def __init__(self, result: Rewritten) -> None:
        self.result = result
        self.root: Any = None
        self.visits = 0
        self.defs_monotone = True
        self.monotone = True

    def run(self, root: Any) -> Any:
        self.root = root
        # a definition referenced from a negated place must not be narrowed anywhere
        self.defs_monotone = not any(
            isinstance(n, dict) and "$ref" in n and set(p.split("/")) & set(_NON_MONOTONE)
            for p, n, _ in iter_subschemas(root))
        return self.node(root, "", True)

    def fired(self, rule: str, pointer: str, narrowing: bool = False) -> None:
        self.result.rules[rule] += 1
        if narrowing:
            self.result.narrowed.append(f"{rule} at {pointer or '/'}")

    # -- the walk ---------------------------------------------------------------------------

    def node(self, node: Any, pointer: str, monotone: bool) -> Any:
        """`node` rewritten, subschemas first. `monotone`: narrowing this node narrows the whole
        schema; false under `not`, `if`, `contains` and a oneOf's branches, where narrowing a
        subschema can widen its parent, so only exact rules apply there."""
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise GrammarError(f"rewriting the schema for the grammar visited over {MAX_VISITS} subschemas; "
                               "simplify its $refs")
        if not isinstance(node, dict):
            return node
        node = dict(node)
        for key in _MAPS:
            if isinstance(node.get(key), dict):
                inner = monotone and (self.defs_monotone or key not in ("$defs", "definitions"))
                node[key] = {n: self.node(s, pointer_join(pointer, key, n), inner) for n, s in node[key].items()}
        for key in _SINGLES:
            if isinstance(node.get(key), (dict, bool)):
                node[key] = self.node(node[key], pointer_join(pointer, key), monotone and key not in _NON_MONOTONE)
        for key in _LISTS:
            if isinstance(node.get(key), list):
                inner = monotone and key not in _NON_MONOTONE
                node[key] = [self.node(s, pointer_join(pointer, key, i), inner) for i, s in enumerate(node[key])]
        if isinstance(node.get("dependencies"), dict):
            node["dependencies"] = {n: self.node(s, pointer_join(pointer, "dependencies", n), monotone)
                                    if isinstance(s, dict) else s for n, s in node["dependencies"].items()}
        self.monotone = monotone
        return self.local(node, pointer)

    def local(self, node: dict, pointer: str) -> Any:
        """The rules for one node, whose subschemas are already rewritten; narrowing rules only
        where self.monotone."""
        for rule in (self.ref_siblings, self.all_of, self.distribute, self.fixed_siblings, self.not_rule,
                     self.dependencies, self.infer_type, self.undeclared_required, self.unknown_format,
                     self.length_pattern, self.integral_multiple, self.int64_bounds, self.exclusive_one_of):
            if not isinstance(node, dict):
                break
            node = rule(node, pointer)
        return node

    def resolved(self, node: Any) -> Any:
        """`node`, or for a bare local {"$ref": ...} a copy of its target (rewritten by the next
        pass). CannotMerge for a target that refers to itself: inlining it would never end."""
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and not _asserting(node, "$ref")):
            return node
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise CannotMerge(f"non-local or root $ref {ref}")
        target = resolve_pointer(self.root, ref)
        if target is None:
            raise CannotMerge(f"unresolvable $ref {ref}")
        if any(isinstance(n, dict) and n.get("$ref") == ref and _asserting(n, "$ref") for n in _walk(target)):
            raise CannotMerge(f"recursive $ref {ref} with keywords beside it")  # inlining would not end
        return copy_json(target)

    # -- rules --------------------------------------------------------------------------------

    def ref_siblings(self, node: dict, pointer: str) -> Any:
        """Keywords beside $ref merged with its target (exact). A recursive reference is left alone."""
        if "$ref" not in node or not _asserting(node, "$ref"):
            return node
        try:
            target = self.resolved({"$ref": node["$ref"]})
            merged = merge(_asserting(node, "$ref"), target)
        except CannotMerge:
            return node
        self.fired("ref-siblings", pointer)
        return {**_kept(node, "$ref"), **merged}

    def all_of(self, node: dict, pointer: str) -> Any:
        """allOf folded into one schema with its siblings (exact); an empty intersection is an error."""
        branches = node.get("allOf")
        if not isinstance(branches, list) or not branches:
            return node
        merged: Any = _asserting(node, "allOf")
        try:
            for branch in branches:
                merged = merge(merged, self.resolved(branch))
        except EmptyIntersection as e:
            raise GrammarError(f"allOf at {pointer or '/ (the root)'} allows no value: {e}") from None
        except CannotMerge:
            return node
        self.fired("allOf", pointer)
        return {**_kept(node, "allOf"), **merged} if isinstance(merged, dict) else merged

    def distribute(self, node: dict, pointer: str) -> Any:
        """Keywords beside anyOf/oneOf merged into every branch (exact: S and exactly-one(Bi) is
        exactly-one(S and Bi)); branches that are or become empty are dropped (exact), and so is a
        node with none left (it becomes false); one branch left is inlined."""
        key = "anyOf" if "anyOf" in node else "oneOf" if "oneOf" in node else None
        if key is None or not isinstance(node[key], list) or ("anyOf" in node and "oneOf" in node):
            return node
        siblings = _asserting(node, key)
        branches = []
        try:
            for branch in node[key]:
                try:
                    branches.append(merge(siblings, self.resolved(branch)) if siblings else branch)
                except EmptyIntersection:
                    continue
        except CannotMerge:
            return node
        branches = [b for b in branches if b is not False]
        if not branches:
            self.fired(f"{key}-siblings", pointer)
            return False  # no branch admits anything: neither does the node
        if not siblings and len(branches) > 1 and branches == node[key]:
            return node
        self.fired(f"{key}-siblings", pointer)
        kept = _kept(node, key)
        if len(branches) == 1:
            return {**kept, **branches[0]} if isinstance(branches[0], dict) else branches[0]
        return {**kept, key: branches}

    def fixed_siblings(self, node: dict, pointer: str) -> Any:
        """Keywords beside enum/const: keep only the values they accept (exact)."""
        if not ("enum" in node or "const" in node) or not _asserting(node, "enum", "const"):
            return node
        fixed = {k: node[k] for k in ("enum", "const") if k in node}
        try:
            merged = merge(fixed, _asserting(node, "enum", "const"))
        except CannotMerge:
            return node
        self.fired("enum-siblings", pointer)
        return {**_kept(node), **merged}

    def not_rule(self, node: dict, pointer: str) -> Any:
        """not of a type, or of values of a finite type, turned into its complement (exact)."""
        negated = node.get("not")
        if not isinstance(negated, dict) or _asserting(negated, "type", "enum", "const") or not _asserting(negated):
            return node
        try:
            allowed = declared_types(node) or set(TYPES)
            if set(_asserting(negated)) == {"type"}:
                types = allowed - declared_types(negated)  # type: ignore[operator]
                if not types or ("number" in types and "integer" not in types):
                    return node  # nothing left, or "numbers but not integers": no type says that
                rest = {k: v for k, v in node.items() if k != "not"}
                self.fired("not-type", pointer)
                return {**rest, "type": type_value(types)}
            if "type" in negated or not allowed <= {"boolean", "null"}:
                return node
            values = negated["enum"] if "enum" in negated else [negated.get("const")]
            universe = [v for v in (None, False, True) if json_type(v) in allowed]
            kept = [v for v in universe if not any(json_equal(v, x) for x in values)]
        except CannotMerge:
            return node
        if not kept:
            return node
        self.fired("not-values", pointer)
        rest = {k: v for k, v in node.items() if k not in ("not", "type")}
        return {**rest, "enum": kept}

    def dependencies(self, node: dict, pointer: str) -> Any:
        """dependentRequired / dependencies expanded into anyOf over "absent" / "present with its
        dependents" per trigger. The "absent" branches close the object (additionalProperties
        false, strict mode's reading anyway): narrowing when it was open."""
        keys = [k for k in ("dependentRequired", "dependencies") if k in node]
        if not keys or "anyOf" in node or "oneOf" in node or "patternProperties" in node or "$ref" in node:
            return node
        deps: dict[str, Any] = {}
        for key in keys:
            if not isinstance(node[key], dict):
                return node
            deps.update(node[key])
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        closed = node.get("additionalProperties") is False
        if not self.monotone and (not closed or "type" not in node):
            return node
        base = {k: v for k, v in node.items() if k not in keys}
        options = []
        for trigger, dependent in deps.items():
            if not isinstance(dependent, (list, dict)):
                return node
            if trigger not in properties and closed:
                continue  # the trigger can never appear
            present = {"required": [trigger, *dependent]} if isinstance(dependent, list) else \
                {"required": [trigger], "__schema__": dependent}
            options.append([present] if trigger in required else [("absent", trigger), present])
        num_branches = 1
        for choice in options:
            num_branches *= len(choice)
        if num_branches > MAX_BRANCHES:
            return node
        branches = []
        try:
            for combination in itertools.product(*options):
                branch = copy_json(base)
                branch.setdefault("type", "object")
                for part in combination:
                    if isinstance(part, tuple):
                        props = branch.get("properties", {})
                        branch["properties"] = {n: s for n, s in props.items() if n != part[1]}
                        branch["additionalProperties"] = False
                        continue
                    extra = {"required": part["required"]}
                    branch = merge(branch, extra)
                    if "__schema__" in part:
                        branch = merge(branch, self.resolved(part["__schema__"]))
                branches.append(branch)
        except EmptyIntersection:
            return node
        except CannotMerge:
            return node
        self.fired("dependencies", pointer, narrowing=not closed or "type" not in node)
        if len(branches) == 1:
            return branches[0]
        kept = _kept(node, *keys)
        return {**kept, "anyOf": [{k: v for k, v in b.items() if k not in kept} for b in branches]}

    def infer_type(self, node: dict, pointer: str) -> Any:
        """An untyped schema whose keywords all describe one type gets that type (narrowing:
        other types were allowed before, unconstrained)."""
        if not self.monotone or "type" in node or any(
                k in node for k in ("$ref", "enum", "const", "anyOf", "oneOf", "allOf", "not")):
            return node
        families = {_FAMILIES[k] for k in node if k in _FAMILIES}
        if len(families) != 1:
            return node
        self.fired("infer-type", pointer, narrowing=True)
        return {**node, "type": families.pop()}

    def undeclared_required(self, node: dict, pointer: str) -> Any:
        """A required name missing from properties is declared with the schema that applies to it
        anyway (the matching patternProperties, else additionalProperties): exact."""
        required = node.get("required")
        types = instance_types(node)
        if not isinstance(required, list) or types != {"object"} or "$ref" in node:
            return node
        properties = node.get("properties", {})
        if not isinstance(properties, dict):
            return node
        missing = [n for n in required if isinstance(n, str) and n not in properties]
        if not missing:
            return node
        additional = node.get("additionalProperties", True)
        patterns = node.get("patternProperties", {})
        added = {}
        for name in missing:
            try:
                matching = [s for p, s in patterns.items() if re.search(p, name)] if isinstance(patterns, dict) else []
            except re.error:
                return node
            if len(matching) > 1:
                return node
            schema = matching[0] if matching else additional
            if schema is False or not isinstance(schema, (dict, bool)):
                return node
            added[name] = schema
        self.fired("required-declared", pointer)
        return {**node, "properties": {**properties, **added}}

    def unknown_format(self, node: dict, pointer: str) -> Any:
        """A format name xgrammar has no regex for is dropped: in 2020-12 format is an annotation
        (exact by the spec); the caller lists it as a note."""
        fmt = node.get("format")
        if fmt is None or fmt in SUPPORTED_FORMATS:
            return node
        self.result.notes.append(f"format {fmt!r} at {pointer or '/ (the root)'} is an annotation, not checked")
        self.fired("unknown-format", pointer)
        return {k: v for k, v in node.items() if k != "format"}

    def length_pattern(self, node: dict, pointer: str) -> Any:
        """minLength/maxLength folded into a simple pattern (see grammar.length_pattern)."""
        pattern = node.get("pattern")
        low, high = node.get("minLength", 0), node.get("maxLength")
        if not isinstance(pattern, str) or ("minLength" not in node and "maxLength" not in node):
            return node
        if not isinstance(low, int) or isinstance(low, bool) or not (high is None or isinstance(high, int)):
            return node
        folded = fold_lengths(pattern, low, high)
        if folded is None or (folded[1] and not self.monotone):
            return node
        self.fired("length-pattern", pointer, narrowing=folded[1])
        rest = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
        return {**rest, "pattern": folded[0]}

    def integral_multiple(self, node: dict, pointer: str) -> Any:
        """A number that is a multiple of a whole number is an integer (exact by JSON Schema,
        where 5.0 is an integer): {"type": "number", "multipleOf": 1.0} -> integer, multipleOf 1."""
        value = node.get("multipleOf")
        if node.get("type") != "number" or isinstance(value, bool) or not isinstance(value, (int, float)):
            return node
        if not (float(value).is_integer() and value > 0):
            return node
        self.fired("integral-multiple", pointer)
        return {**node, "type": "integer", "multipleOf": int(value)}

    def int64_bounds(self, node: dict, pointer: str) -> Any:
        """Integer bounds beyond 64 bits clamped to the int64 range (narrowing)."""
        if not self.monotone or instance_types(node) != {"integer"}:
            return node
        out = dict(node)
        for key, clamp in (("minimum", max), ("exclusiveMinimum", max), ("maximum", min), ("exclusiveMaximum", min)):
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
                out[key] = clamp(int(value), INT64_MIN) if clamp is max else clamp(int(value), INT64_MAX)
        if out == node:
            return node
        if (isinstance(node.get("minimum"), (int, float)) and node["minimum"] > INT64_MAX) or \
                (isinstance(node.get("maximum"), (int, float)) and node["maximum"] < INT64_MIN):
            return node  # the range lies outside int64: left for xgrammar to refuse
        self.fired("int64-bounds", pointer, narrowing=True)
        return out

    def exclusive_one_of(self, node: dict, pointer: str) -> Any:
        """A oneOf whose branches are proven pairwise disjoint is an anyOf (exact)."""
        branches = node.get("oneOf")
        if not isinstance(branches, list) or len(branches) < 2 or "anyOf" in node:
            return node
        try:
            resolved = [self.resolved(b) for b in branches]
        except CannotMerge:
            return node
        rest = {k: v for k, v in node.items() if k != "oneOf"}
        if all(disjoint(x, y) for x, y in itertools.combinations(resolved, 2)):
            self.fired("oneOf-exclusive", pointer)
            return {**rest, "anyOf": branches}
        by_required = one_of_by_required(resolved)
        if by_required is None or (by_required[1] and not self.monotone):
            return node
        self.fired("oneOf-required", pointer, narrowing=by_required[1])
        return {**rest, "anyOf": by_required[0]}


def _walk(node: Any):
    """Every dict and list nested in a JSON value, the value first."""
    stack = [node]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
