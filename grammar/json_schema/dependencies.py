"""Rewrite rule for `dependentRequired` / `dependencies`: expanded into alternatives ("the trigger
is absent" / "present with its dependents"), as long as their number stays bounded."""
from __future__ import annotations

import itertools
from typing import Any

from grammar.json_schema.merge import CannotMerge, copy_json, merge
from grammar.json_schema.one_of import MAX_ALTERNATIVES
from grammar.json_schema.rule import RuleContext, kept

MAX_BRANCHES = MAX_ALTERNATIVES  # dependencies expanded into at most this many alternatives


def dependencies(node: dict, pointer: str, context: RuleContext) -> Any:
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
    if not context.monotone and (not closed or "type" not in node):
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
                branch = merge(branch, {"required": part["required"]})
                if "__schema__" in part:
                    branch = merge(branch, context.resolved(part["__schema__"]))
            branches.append(branch)
    except CannotMerge:  # an EmptyIntersection too
        return node
    context.fired("dependencies", pointer, narrowing=not closed or "type" not in node)
    if len(branches) == 1:
        return branches[0]
    rest = kept(node, *keys)
    return {**rest, "anyOf": [{k: v for k, v in b.items() if k not in rest} for b in branches]}
