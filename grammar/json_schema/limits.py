"""The size and depth limits of GrammarConfig, checked on a constraint's text before anything
expensive reads it."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from grammar.backend import GrammarError
from grammar.json_schema.walk import iter_subschemas

if TYPE_CHECKING:
    from grammar.constraint import Constraint


def check_limits(constraint: Constraint, max_spec_bytes: int, max_schema_depth: int) -> None:
    """Raise GrammarError if the spec is larger or (for a schema) deeper than the limits allow.

    Runs before anything expensive: the spec text is measured first, then the schema is parsed.
    """
    num_bytes = len(constraint.spec.encode()) + sum(len(c.encode()) for c in constraint.choices)
    if num_bytes > max_spec_bytes:
        raise GrammarError(f"{constraint.kind} spec is {num_bytes} bytes, over the max_spec_bytes "
                           f"limit of {max_spec_bytes}")
    if constraint.kind != "json_schema":
        return
    schema = parse_schema(constraint.spec, max_schema_depth)
    depth = max(d for _, _, d in iter_subschemas(schema))
    if depth > max_schema_depth:
        raise GrammarError(f"schema nesting depth is {depth}, over the max_schema_depth limit "
                           f"of {max_schema_depth}")


def parse_schema(spec: str, max_schema_depth: int | None = None) -> Any:
    """json.loads, with GrammarError (not RecursionError) for absurdly nested text."""
    try:
        return json.loads(spec)
    except RecursionError:
        limit = f" (the max_schema_depth limit is {max_schema_depth})" if max_schema_depth else ""
        raise GrammarError(f"schema is nested too deeply to parse{limit}") from None
    except json.JSONDecodeError as e:
        raise GrammarError(f"json_schema is not valid JSON: {e}") from None
