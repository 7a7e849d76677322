"""Structural tags: free text, or fixed text, with tagged parts whose content is constrained.

A "structural_tag" Constraint carries one as JSON text, in either shape peers accept:

* xgrammar's format tree: `{"type": "structural_tag", "format": {...}}`, a format being one of
  FORMAT_TYPES (`tag`: begin, content, end; `triggered_tags`: free text until a trigger, then one
  of its tags; `json_schema`, `regex`, `grammar`: content in that constraint; ...);
* the older vLLM / SGLang shape: `{"type": "structural_tag", "structures": [{"begin", "schema",
  "end"}], "triggers": [...]}`, which is `triggered_tags` over tags with JSON-schema content.

`parse_structural_tag` checks either fully and returns the format tree (the older shape turned
into it); every error names the field by its path (`format.tags[1].end`). The backends compile
the tree: each content leaf (`json_schema`, `regex`, `grammar`) through the same path as a
constraint of that kind (`map_contents`), the rest as the library reads it. Library-free.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Format = dict[str, Any]
# the format types accepted, and each one's fields (required, optional)
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "const_string": (("value",), ()),
    "json_schema": (("json_schema",), ("style",)),
    "regex": (("pattern",), ()),
    "grammar": (("grammar",), ("syntax",)),
    "any_text": ((), ("excludes", "max_tokens", "max_chars")),
    "sequence": (("elements",), ()),
    "or": (("elements",), ()),
    "tag": (("begin", "content", "end"), ()),
    "triggered_tags": (("triggers", "tags"), ("at_least_one", "stop_after_first", "excludes")),
    "tags_with_separator": (("tags", "separator"), ("at_least_one", "stop_after_first")),
}
FORMAT_TYPES = tuple(_FIELDS)
# the formats whose content is a constraint of its own kind, compiled by the backend's path for it
CONTENT_TYPES = ("json_schema", "regex", "grammar")
_CONTENT_FIELD = {"json_schema": "json_schema", "regex": "pattern", "grammar": "grammar"}
MAX_DEPTH = 32  # nested formats
_GRAMMAR_SYNTAXES = ("ebnf", "lark")


class StructuralTagError(ValueError):
    """A structural tag that is not well formed; the message starts with the field's path."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path  # "structural_tag" for the tag as a whole
        self.problem = problem


def parse_structural_tag(spec: str) -> Format:
    """The format tree of a structural tag's JSON text (either shape), checked; StructuralTagError
    names the first problem by its field path."""
    try:
        data = json.loads(spec)
    except json.JSONDecodeError as e:
        raise StructuralTagError("structural_tag", f"is not valid JSON: {e}") from None
    except RecursionError:
        raise StructuralTagError("structural_tag", "is nested too deeply to parse") from None
    if not isinstance(data, dict):
        raise StructuralTagError("structural_tag", "must be a JSON object")
    if data.get("type", "structural_tag") != "structural_tag":
        raise StructuralTagError("type", f'must be "structural_tag", got {data["type"]!r}')
    if "format" in data:
        _no_other_fields(data, ("type", "format"), "")
        format_ = data["format"]
        _check(format_, "format", 0)
        return format_
    if "structures" in data or "triggers" in data:
        _no_other_fields(data, ("type", "structures", "triggers"), "")
        format_ = _from_structures(data.get("structures"), data.get("triggers"))
        _check_triggers(format_, "", older_shape=True)
        return format_
    raise StructuralTagError("structural_tag", 'needs "format" (xgrammar\'s shape) or "structures" and '
                                               '"triggers" (the vLLM / SGLang shape)')


def map_contents(format_: Format, compile_content: Callable[[Format, str], Format], path: str = "format") -> Format:
    """A copy of `format_` with each content leaf (CONTENT_TYPES) replaced by
    `compile_content(leaf, its path)`; the rest is kept as it is."""
    kind = format_["type"]
    if kind in CONTENT_TYPES:
        return compile_content(format_, path)
    out = dict(format_)
    if kind in ("sequence", "or"):
        out["elements"] = [map_contents(e, compile_content, f"{path}.elements[{i}]")
                           for i, e in enumerate(format_["elements"])]
    elif kind == "tag":
        out["content"] = map_contents(format_["content"], compile_content, f"{path}.content")
    elif kind in ("triggered_tags", "tags_with_separator"):
        out["tags"] = [map_contents(t, compile_content, f"{path}.tags[{i}]") for i, t in enumerate(format_["tags"])]
    return out


def is_older_shape(spec: str) -> bool:
    """Whether a checked structural tag's text is in the older structures + triggers shape."""
    return "format" not in json.loads(spec)


def content_field(path: str, leaf: Format, older_shape: bool) -> str:
    """The request field of the content leaf at `path` (map_contents' path): its schema, pattern or
    grammar, named in the shape the tag was sent in (`older_shape`: is_older_shape)."""
    tag = re.fullmatch(r"format\.tags\[(\d+)\]\.content", path)
    if older_shape and tag:
        return f"structures[{tag.group(1)}].schema"
    return f"{path}.{_CONTENT_FIELD[leaf['type']]}"


def iter_contents(format_: Format, path: str = "format") -> list[tuple[str, Format]]:
    """(path, leaf) of every content leaf (CONTENT_TYPES), in order."""
    found: list[tuple[str, Format]] = []

    def collect(leaf: Format, where: str) -> Format:
        found.append((where, leaf))
        return leaf
    map_contents(format_, collect, path)
    return found


def tag_ends(format_: Format) -> list[str]:
    """Every end string of the tags in `format_` (the words a closing may need)."""
    ends: list[str] = []

    def visit(node: Format) -> None:
        if node["type"] == "tag":
            ends.extend([node["end"]] if isinstance(node["end"], str) else node["end"])
            visit(node["content"])
        for child in node.get("elements", []) + node.get("tags", []):
            visit(child)
    visit(format_)
    return ends


def conflicting_trigger(tagged: Format, trigger: str) -> int | None:
    """The index of the first trigger of `tagged` (a format whose top is `triggered_tags`) that
    clashes with another `trigger` joining it (one is a prefix of the other: the text could not
    tell which is meant), or None."""
    if tagged["type"] != "triggered_tags":
        return None
    for index, own in enumerate(tagged["triggers"]):
        if own.startswith(trigger) or trigger.startswith(own):
            return index
    return None


def _from_structures(structures: Any, triggers: Any) -> Format:
    """The older shape as a triggered_tags format; its field paths stay the older shape's."""
    if not isinstance(structures, list) or not structures:
        raise StructuralTagError("structures", "must be a non-empty list of {begin, schema, end}")
    tags = []
    for index, item in enumerate(structures):
        where = f"structures[{index}]"
        if not isinstance(item, dict):
            raise StructuralTagError(where, "must be an object with begin, schema and end")
        _no_other_fields(item, ("begin", "schema", "end"), where + ".")
        for name in ("begin", "schema", "end"):
            if name not in item:
                raise StructuralTagError(f"{where}.{name}", "is required")
        _string(item["begin"], f"{where}.begin", non_empty=True)
        _string(item["end"], f"{where}.end")
        schema = item["schema"]
        if isinstance(schema, str):  # sent as JSON text
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise StructuralTagError(f"{where}.schema", f"is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise StructuralTagError(f"{where}.schema", "must be a JSON Schema (an object or a boolean)")
        tags.append({"type": "tag", "begin": item["begin"], "content": {"type": "json_schema", "json_schema": schema},
                     "end": item["end"]})
    return {"type": "triggered_tags", "triggers": triggers, "tags": tags}


def _check(node: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise StructuralTagError(path, f"formats are nested more than {MAX_DEPTH} deep")
    if not isinstance(node, dict):
        raise StructuralTagError(path, "must be a format object with a type")
    kind = node.get("type")
    if kind not in _FIELDS:
        raise StructuralTagError(f"{path}.type", f"unknown format type {kind!r}; expected one of "
                                                 f"{', '.join(FORMAT_TYPES)}")
    required, optional = _FIELDS[kind]
    _no_other_fields(node, ("type", *required, *optional), path + ".")
    for name in required:
        if name not in node:
            raise StructuralTagError(f"{path}.{name}", f"is required in a {kind} format")
    _CHECKS[kind](node, path, depth)


def _no_other_fields(node: dict, known: tuple[str, ...], prefix: str) -> None:
    for name in node:
        if name not in known:
            raise StructuralTagError(f"{prefix}{name}", f"is not a field of this format; expected "
                                                        f"{', '.join(known)}")


def _string(value: Any, path: str, non_empty: bool = False) -> None:
    if not isinstance(value, str) or (non_empty and not value):
        raise StructuralTagError(path, "must be a non-empty string" if non_empty else "must be a string")


def _strings(value: Any, path: str, non_empty: bool) -> None:
    if not isinstance(value, list) or (non_empty and not value):
        raise StructuralTagError(path, "must be a non-empty list of strings" if non_empty else "must be a list")
    for index, item in enumerate(value):
        _string(item, f"{path}[{index}]", non_empty=True)


def _flags(node: dict, path: str, names: tuple[str, ...]) -> None:
    for name in names:
        if name in node and not isinstance(node[name], bool):
            raise StructuralTagError(f"{path}.{name}", "must be true or false")


def _count(node: dict, path: str, name: str) -> None:
    value = node.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31):
        raise StructuralTagError(f"{path}.{name}", "must be an integer >= 0")


def _check_const_string(node: dict, path: str, depth: int) -> None:
    _string(node["value"], f"{path}.value", non_empty=True)


def _check_json_schema(node: dict, path: str, depth: int) -> None:
    if not isinstance(node["json_schema"], (dict, bool)):
        raise StructuralTagError(f"{path}.json_schema", "must be a JSON Schema (an object or a boolean)")
    if node.get("style", "json") != "json":
        raise StructuralTagError(f"{path}.style", f'only "json" is supported, got {node["style"]!r}')


def _check_regex(node: dict, path: str, depth: int) -> None:
    _string(node["pattern"], f"{path}.pattern", non_empty=True)


def _check_grammar(node: dict, path: str, depth: int) -> None:
    _string(node["grammar"], f"{path}.grammar", non_empty=True)
    if node.get("syntax", "ebnf") not in _GRAMMAR_SYNTAXES:
        raise StructuralTagError(f"{path}.syntax", f'must be "ebnf" or "lark", got {node["syntax"]!r}')


def _check_any_text(node: dict, path: str, depth: int) -> None:
    if "excludes" in node:
        _strings(node["excludes"], f"{path}.excludes", non_empty=False)
    _count(node, path, "max_tokens")
    _count(node, path, "max_chars")


def _check_elements(node: dict, path: str, depth: int) -> None:
    elements = node["elements"]
    if not isinstance(elements, list) or not elements:
        raise StructuralTagError(f"{path}.elements", "must be a non-empty list of formats")
    for index, element in enumerate(elements):
        _check(element, f"{path}.elements[{index}]", depth + 1)


def _check_tag(node: dict, path: str, depth: int) -> None:
    _string(node["begin"], f"{path}.begin")
    if isinstance(node["end"], list):
        _strings(node["end"], f"{path}.end", non_empty=True)
    else:
        _string(node["end"], f"{path}.end")
    _check(node["content"], f"{path}.content", depth + 1)


def _check_tags(node: dict, path: str, depth: int) -> None:
    tags = node["tags"]
    if not isinstance(tags, list) or not tags:
        raise StructuralTagError(f"{path}.tags", "must be a non-empty list of tag formats")
    for index, tag in enumerate(tags):
        where = f"{path}.tags[{index}]"
        if not isinstance(tag, dict) or tag.get("type") != "tag":
            raise StructuralTagError(where, 'must be a format of type "tag"')
        _check(tag, where, depth + 1)
    _flags(node, path, ("at_least_one", "stop_after_first"))
    if node["type"] == "tags_with_separator":
        _string(node["separator"], f"{path}.separator")
        return
    if "excludes" in node:
        _strings(node["excludes"], f"{path}.excludes", non_empty=False)
    _check_triggers(node, path)


def _check_triggers(node: dict, path: str, older_shape: bool = False) -> None:
    """Each tag's begin starts with exactly one trigger, and each trigger starts some tag's begin."""
    triggers_path = "triggers" if older_shape else f"{path}.triggers"
    triggers = node["triggers"]
    _strings(triggers, triggers_path, non_empty=True)
    used: set[str] = set()
    for index, tag in enumerate(node["tags"]):
        where = f"structures[{index}].begin" if older_shape else f"{path}.tags[{index}].begin"
        matching = [t for t in triggers if tag["begin"].startswith(t)]
        if not matching:
            raise StructuralTagError(where, f"{tag['begin']!r} starts with none of the triggers "
                                            f"{triggers!r}; a tag is only reached through its trigger")
        if len(matching) > 1:
            raise StructuralTagError(where, f"{tag['begin']!r} starts with more than one trigger ({matching!r})")
        used.update(matching)
    for index, trigger in enumerate(triggers):
        if trigger not in used:
            raise StructuralTagError(f"{triggers_path}[{index}]", f"{trigger!r} is not the start of any tag's begin")


_CHECKS: dict[str, Callable[[dict, str, int, bool], None]] = {
    "const_string": _check_const_string, "json_schema": _check_json_schema, "regex": _check_regex,
    "grammar": _check_grammar, "any_text": _check_any_text, "sequence": _check_elements, "or": _check_elements,
    "tag": _check_tag, "triggered_tags": _check_tags, "tags_with_separator": _check_tags,
}
