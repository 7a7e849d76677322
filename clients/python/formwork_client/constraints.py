"""Constraint builders: the shape the output must have (formwork.v1.Constraint).

    json_schema({"type": "object", ...})   json_object()   regex(r"[A-Z]{3}")
    grammar('root ::= "yes" | "no"')       choice(["red", "green"])
    structural_tag({"type": "structural_tag", "format": {...}})

Every builder takes the options that apply to it; None (default) leaves the field unset, so the
server's default applies: strict=True (unenforceable schema keywords are an error), whitespace=the
server's default JSON whitespace (docs/constraints.md), any_whitespace=False, jump_forward=the
server's setting (on unless started with --no-jump-forward), close_early=the server's setting (on
unless started with --no-close-early: the output is closed before max_tokens runs out, or when it
loops, and the response's closed_early says so), grammar_backend=the server's (auto unless
started with another --grammar-backend; the response's grammar_backend names the one that served
it). `whitespace` is one of "compact", "spaced", "bounded", "any"; `grammar_backend` one of "auto",
"xgrammar", "llguidance".
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from formwork_client._gen.formwork.v1 import generation_pb2 as pb

# what calls accept where a constraint goes: a built Constraint, or a JSON Schema (dict, JSON text, bool)
ConstraintLike = pb.Constraint | Mapping[str, Any] | str | bool
# the call metadata that carries constraint_key(): a load balancer in front of several servers
# hashes it, so one constraint keeps meeting the same server's warm compile cache (docs/deploy.md)
CONSTRAINT_KEY_HEADER = "x-formwork-constraint-key"
WHITESPACE = {"compact": pb.JSON_WHITESPACE_COMPACT, "spaced": pb.JSON_WHITESPACE_SPACED,
              "bounded": pb.JSON_WHITESPACE_BOUNDED, "any": pb.JSON_WHITESPACE_ANY}
GRAMMAR_BACKENDS = {"auto": pb.GRAMMAR_BACKEND_AUTO, "xgrammar": pb.GRAMMAR_BACKEND_XGRAMMAR,
                    "llguidance": pb.GRAMMAR_BACKEND_LLGUIDANCE}


def json_schema(schema: Mapping[str, Any] | str | bool, *, strict: bool | None = None,
                any_whitespace: bool | None = None, jump_forward: bool | None = None,
                whitespace: str | None = None, close_early: bool | None = None,
                grammar_backend: str | None = None) -> pb.Constraint:
    """A JSON Schema (a dict, or JSON text). Sent as JSON text (`json_schema_text`), so the order of
    properties, which is the order the model writes them in, and numbers are kept as written."""
    text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
    return _whitespace(_options(pb.Constraint(json_schema_text=text), strict, any_whitespace, jump_forward,
                                close_early, grammar_backend), whitespace)


def json_object(*, any_whitespace: bool | None = None, jump_forward: bool | None = None,
                whitespace: str | None = None, close_early: bool | None = None,
                grammar_backend: str | None = None) -> pb.Constraint:
    """Any JSON object."""
    return _whitespace(_options(pb.Constraint(json_object=pb.JsonObject()), None, any_whitespace, jump_forward,
                                close_early, grammar_backend), whitespace)


def regex(pattern: str, *, strict: bool | None = None, jump_forward: bool | None = None,
          grammar_backend: str | None = None) -> pb.Constraint:
    """A regular expression the whole output must match."""
    return _options(pb.Constraint(regex=pattern), strict, None, jump_forward, grammar_backend=grammar_backend)


def grammar(ebnf: str, *, strict: bool | None = None, jump_forward: bool | None = None,
            grammar_backend: str | None = None) -> pb.Constraint:
    """An EBNF grammar (xgrammar's GBNF dialect) whose start rule is named `root`."""
    return _options(pb.Constraint(grammar=ebnf), strict, None, jump_forward, grammar_backend=grammar_backend)


def choice(choices: Iterable[str], *, jump_forward: bool | None = None,
           grammar_backend: str | None = None) -> pb.Constraint:
    """Exactly one of the given (non-empty) strings."""
    if isinstance(choices, str):
        raise TypeError("choice() takes a list of strings, not one string")
    return _options(pb.Constraint(choice=pb.Choice(choices=list(choices))), None, None, jump_forward,
                    grammar_backend=grammar_backend)


def structural_tag(tag: Mapping[str, Any] | str, *, strict: bool | None = None, any_whitespace: bool | None = None,
                   jump_forward: bool | None = None, whitespace: str | None = None,
                   close_early: bool | None = None, grammar_backend: str | None = None) -> pb.Constraint:
    """A structural tag (a dict, or JSON text): xgrammar's {"type": "structural_tag", "format":
    {...}}, or the older {"type": "structural_tag", "structures": [{"begin", "schema", "end"}],
    "triggers": [...]}: free text until a trigger, then the tag's content in its schema up to its
    end (docs/constraints.md). The options apply to the JSON Schemas inside it."""
    text = tag if isinstance(tag, str) else json.dumps(tag, ensure_ascii=False)
    return _whitespace(_options(pb.Constraint(structural_tag=text), strict, any_whitespace, jump_forward,
                                close_early, grammar_backend), whitespace)


def to_constraint(constraint: ConstraintLike) -> pb.Constraint:
    """A Constraint as it is; anything else is taken as a JSON Schema."""
    if isinstance(constraint, pb.Constraint):
        return constraint
    if isinstance(constraint, (Mapping, str, bool)):
        return json_schema(constraint)
    raise TypeError(f"expected a formwork Constraint or a JSON Schema (dict, JSON text or bool), "
                    f"got {type(constraint).__name__}")


def constraint_key(constraint: pb.Constraint) -> str | None:
    """A short hash of what the constraint compiles from (its kind and text; options not
    included), None without one. JSON Schema text counts in its compact form (key order kept),
    so the Node client, whose JSON.stringify spaces nothing, gives the same key for the same schema."""
    kind = constraint.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "json_schema":  # a Struct: a map, so its keys are sorted
        from google.protobuf import json_format
        spec = _compact_json(json_format.MessageToDict(constraint.json_schema), sort_keys=True)
    elif kind in ("json_schema_text", "structural_tag"):
        text = getattr(constraint, kind)
        try:
            spec = _compact_json(json.loads(text))
        except ValueError:  # the server will say what is wrong; any stable key will do
            spec = text
    elif kind == "choice":
        spec = "\0".join(constraint.choice.choices)
    elif kind == "json_object":
        spec = ""
    else:
        spec = getattr(constraint, kind)
    return hashlib.sha256(f"{kind}\0{spec}".encode()).hexdigest()[:32]


def _compact_json(value: Any, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys)


def _whitespace(constraint: pb.Constraint, whitespace: str | None) -> pb.Constraint:
    if whitespace is not None:
        if whitespace not in WHITESPACE:
            raise ValueError(f"whitespace must be one of {', '.join(WHITESPACE)}, not {whitespace!r}")
        constraint.whitespace = WHITESPACE[whitespace]
    return constraint


def _options(constraint: pb.Constraint, strict: bool | None, any_whitespace: bool | None,
             jump_forward: bool | None, close_early: bool | None = None,
             grammar_backend: str | None = None) -> pb.Constraint:
    # proto3 `optional`: set only what the caller chose, so the server's defaults apply otherwise
    for name, value in (("strict", strict), ("any_whitespace", any_whitespace), ("jump_forward", jump_forward),
                        ("close_early", close_early)):
        if value is not None:
            setattr(constraint, name, value)
    if grammar_backend is not None:
        if grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {', '.join(GRAMMAR_BACKENDS)}, not {grammar_backend!r}")
        constraint.grammar_backend = GRAMMAR_BACKENDS[grammar_backend]
    return constraint
