"""What a rewrite rule of grammar.json_schema.rewrite sees: the node's place, the root, and where it reports.

A rule is a function `rule(node, pointer, context) -> node`: it gets one schema object whose
subschemas are already rewritten, and returns it rewritten (or the same object when it does not
apply). It never modifies its input. A narrowing rule runs only where `context.monotone`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grammar.json_schema.merge import CannotMerge, copy_json
from grammar.json_schema.walk import ASSERTIONS, resolve_pointer


@dataclass
class RuleContext:
    """The state rules share during one rewrite: set by the walk, read and reported to by rules."""

    root: Any = None  # the schema as this pass found it (references resolve against it)
    enforced_formats: frozenset[str] = frozenset()  # the backend's (GrammarBackend.enforced_formats)
    monotone: bool = True  # narrowing the current node narrows the whole schema
    rules: Counter = field(default_factory=Counter)  # rule name -> times applied
    narrowed: list[str] = field(default_factory=list)  # "rule at pointer" for each narrowing
    notes: list[str] = field(default_factory=list)  # e.g. format names taken as annotations
    # definitions rules add, by name: the walk puts them in the root's $defs after its pass
    new_defs: dict[str, Any] = field(default_factory=dict)

    def fired(self, rule: str, pointer: str, narrowing: bool = False) -> None:
        self.rules[rule] += 1
        if narrowing:
            self.narrowed.append(f"{rule} at {pointer or '/'}")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def resolved(self, node: Any) -> Any:
        """`node`, or for a bare local {"$ref": ...} a copy of its target (rewritten by the next
        pass). CannotMerge for a target that refers to itself: inlining it would never end."""
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and not asserting(node, "$ref")):
            return node
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise CannotMerge(f"non-local or root $ref {ref}")
        target = resolve_pointer(self.root, ref)
        if target is None:
            raise CannotMerge(f"unresolvable $ref {ref}")
        if any(isinstance(n, dict) and n.get("$ref") == ref and asserting(n, "$ref") for n in walk_json(target)):
            raise CannotMerge(f"recursive $ref {ref} with keywords beside it")  # inlining would not end
        return copy_json(target)


def asserting(node: dict, *exclude: str) -> dict:
    """The keywords of `node` that assert something, minus `exclude`."""
    return {k: v for k, v in node.items() if k in ASSERTIONS and k not in exclude}


def kept(node: dict, *exclude: str) -> dict:
    """What stays on the node when its assertions move elsewhere: annotations, $defs, x-..."""
    return {k: v for k, v in node.items() if k not in ASSERTIONS and k not in exclude}


def walk_json(node: Any):
    """Every dict and list nested in a JSON value, the value first."""
    stack = [node]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
