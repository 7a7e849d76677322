"""A JSON schema as llguidance compiles it: the pure-Python part of an llguidance compile, which
needs no tokenizer, so that it can run in the schema worker (grammar/schema_worker.py) as well as
in the engine's process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grammar.json_schema.limits import parse_schema
from grammar.json_schema.rewrite import rewrite
from grammar.json_schema.values import check_keyword_values
from grammar.llguidance import output_bounds
from grammar.llguidance.json_options import ENFORCED_FORMATS, closed_schema
from grammar.runtime.closing_hints import closing_hints

if TYPE_CHECKING:
    from grammar.config import GrammarConfig
    from grammar.constraint import Constraint


@dataclass
class PreparedSchema:
    """A json_schema constraint's schema after Formwork's rewrite, checked, as plain data."""

    schema: Any  # the rewritten schema, undeclared properties closed as on xgrammar
    notes: list[str] = field(default_factory=list)  # what the rewrite does not enforce
    closing_hints: list[str] = field(default_factory=list)  # grammar/runtime/closing_hints.py


def prepare(constraint: Constraint, config: GrammarConfig, with_hints: bool = True) -> PreparedSchema:
    """The rewritten schema (the same normalized schema xgrammar sees), its forced output checked
    against max_forced_bytes (GrammarError), and, `with_hints`, its closing hints."""
    parsed = parse_schema(constraint.spec)
    check_keyword_values(parsed, config.max_repeat_count)
    rewritten = rewrite(parsed, ENFORCED_FORMATS)
    output_bounds.check_schema(rewritten.schema, config.max_forced_bytes)
    return PreparedSchema(closed_schema(rewritten.schema), rewritten.notes,
                          closing_hints(constraint) if with_hints else [])
