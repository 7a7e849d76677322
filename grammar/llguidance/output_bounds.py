"""The output a constraint needs at least, read from its text before llguidance sees it.

xgrammar's backend reads this off its compiled rules (grammar/xgrammar/output_bounds.py);
llguidance exposes no rules, so here the regexes and the JSON-Schema keywords that set a minimum
size are read directly: a regex's shortest match (grammar/regex/parsed.py), a string's minLength
or pattern, an array's minItems. What needs more than max_forced_bytes at one point is refused,
as on xgrammar, and so is a schema with no finite instance (grammar/json_schema/finite.py: a
required property referring back to its parent). Pure text; a grammar that never ends past an
optional part is not found here (docs/constraints.md).
"""
from __future__ import annotations

from typing import Any

from grammar.backend import GrammarError
from grammar.json_schema.finite import forced_cycle
from grammar.json_schema.walk import iter_subschemas
from grammar.regex.parsed import lengths, parse_regex


def regex_min_bytes(pattern: str) -> int:
    """Characters of the shortest match (each at least a byte); 0 where the pattern is not read."""
    try:
        parsed = parse_regex(pattern)
    except RecursionError:  # nested past Python's stack: llguidance's own parser refuses it
        return 0
    if not parsed:
        return 0
    return min(lengths(branch)[0] for branch in parsed)


def check_regex(kind: str, pattern: str, limit: int) -> None:
    needed = regex_min_bytes(pattern)
    if needed > limit:
        raise GrammarError(f"{kind} needs at least {needed} bytes of output, over this server's max_forced_bytes "
                           f"limit of {limit}; lower its repetition counts")


def check_schema(schema: Any, limit: int) -> None:
    """A string or an array a schema requires to be longer than `limit` bytes (an item takes at
    least a byte and a comma), or a part every instance contains that contains itself."""
    cycle = forced_cycle(schema)
    if cycle is not None:
        raise GrammarError(f"json_schema accepts no output of finite length: the part at {cycle or '/ (the root)'} "
                           "is required in itself (e.g. a required property whose schema refers back to its "
                           "parent), so its text would be forced without end")
    for pointer, node, _ in iter_subschemas(schema):
        if not isinstance(node, dict):
            continue
        where = pointer or "/ (the root)"
        needs = []
        if isinstance(node.get("minLength"), int):
            needs.append(("minLength", node["minLength"]))
        if isinstance(node.get("minItems"), int):
            needs.append(("minItems", 2 * node["minItems"]))
        if isinstance(node.get("pattern"), str):
            needs.append(("pattern", regex_min_bytes(node["pattern"])))
        for keyword, needed in needs:
            if needed > limit:
                raise GrammarError(f'json_schema: "{keyword}" at {where} needs at least {needed} bytes of output, '
                                   f"over this server's max_forced_bytes limit of {limit}")
