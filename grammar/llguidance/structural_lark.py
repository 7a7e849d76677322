"""A structural tag's format tree (grammar/chat/structural_tag.py) as the Lark grammar llguidance
reads, its contents already compiled as named sub-grammars (`{"type": "ref", "name": ...}` leaves,
written `@name`). Pure text.

Free text is one lexeme that ends where the next fixed text starts, as the think section's is
(grammar/llguidance/lark_text.py): llguidance's `&` and `~` make "any text whose only trigger is
at its end" a regex, so the lexer never has to choose where free text stops:

* `triggered_tags`: `(FREE_i rest_i)* TAIL?`, FREE_i any text without a trigger (or an excluded
  string) that ends with trigger i, rest_i the rest of one of its tags' begin, the content, the end;
  TAIL the text after the last tag. `at_least_one` starts with a whole tag, `stop_after_first`
  ends after one.
* `any_text` as a tag's content: one lexeme up to and including the tag's first end.

What cannot be written so is refused (UnsupportedError, so auto takes xgrammar): `any_text`
anywhere but a tag's content, and its `max_tokens` / `max_chars` budgets.
"""
from __future__ import annotations

from typing import Any

from grammar.backend import UnsupportedError
from grammar.llguidance.lark_text import literal, regex_escape

Format = dict[str, Any]


class StructuralLark:
    """Writes one format tree's rules; `lark()` is the whole grammar, start rule first."""

    def __init__(self) -> None:
        self._rules: list[str] = []
        self._num_rules = 0

    def lark(self, format_: Format) -> str:
        start = self._format(format_, "format")
        return "\n".join([f"start: {start}", *self._rules]) + "\n"

    def _rule(self, body: str, terminal: bool = False) -> str:
        """A new rule (or terminal) named for `body`; returns its name."""
        self._num_rules += 1
        name = f"FREE_{self._num_rules}" if terminal else f"part_{self._num_rules}"
        self._rules.append(f"{name}: {body}")
        return name

    def _format(self, node: Format, path: str) -> str:
        """The Lark expression matching `node`."""
        kind = node["type"]
        if kind == "ref":
            return "@" + node["name"]
        if kind == "const_string":
            return literal(node["value"])
        if kind in ("sequence", "or"):
            elements = [self._format(e, f"{path}.elements[{i}]") for i, e in enumerate(node["elements"])]
            return self._rule((" " if kind == "sequence" else " | ").join(elements))
        if kind == "tag":
            return self._rule(self._tag_body(node, path, node["begin"]))
        if kind == "tags_with_separator":
            return self._tags_with_separator(node, path)
        if kind == "triggered_tags":
            return self._triggered_tags(node, path)
        raise UnsupportedError(f"{path}: {kind} is only supported by the xgrammar backend here (llguidance has "
                               "no end for free text that is not a tag's content)")

    def _tag_body(self, tag: Format, path: str, begin: str) -> str:
        """`begin` (the tag's begin, or what follows its trigger), the content, the end."""
        ends = [tag["end"]] if isinstance(tag["end"], str) else tag["end"]
        content = tag["content"]
        opening = literal(begin) + " " if begin else ""
        if content["type"] == "any_text":
            return opening + self._text_up_to(content, ends, f"{path}.content")
        closing = " | ".join(literal(end) for end in ends if end)
        if closing and len(ends) > 1:
            closing = f"({closing})"
        if "" in ends and closing:
            closing += "?"
        return f"{opening}{self._format(content, path + '.content')} {closing}".rstrip()

    def _text_up_to(self, text: Format, ends: list[str], path: str) -> str:
        if text.get("max_tokens") is not None or text.get("max_chars") is not None:
            raise UnsupportedError(f"{path}: any_text's max_tokens / max_chars are only enforced by the xgrammar "
                                   "backend")
        if not all(ends):
            raise UnsupportedError(f"{path}: any_text before an empty end is only supported by the xgrammar backend")
        return self._rule(_free_text_ending_with(ends, ends, text.get("excludes", [])), terminal=True)

    def _tags_with_separator(self, node: Format, path: str) -> str:
        tag = self._rule(" | ".join(self._format(t, f"{path}.tags[{i}]") for i, t in enumerate(node["tags"])))
        if node.get("stop_after_first"):
            body = tag
        else:
            separator = literal(node["separator"]) + " " if node["separator"] else ""
            body = f"{tag} ({separator}{tag})*"
        return self._rule(body if node.get("at_least_one") else f"({body})?")

    def _triggered_tags(self, node: Format, path: str) -> str:
        triggers: list[str] = node["triggers"]
        excludes: list[str] = node.get("excludes", [])
        after_trigger = []
        for trigger in triggers:
            rests = [self._tag_body(tag, f"{path}.tags[{i}]", tag["begin"][len(trigger):])
                     for i, tag in enumerate(node["tags"]) if tag["begin"].startswith(trigger)]
            free = self._rule(_free_text_ending_with([trigger], triggers, excludes), terminal=True)
            after_trigger.append(f"{free} ({' | '.join(rests)})")
        forbidden = _alternatives(triggers + excludes)
        tail = self._rule(f"/(?s:.+)/ & ~/(?s:.*(?:{forbidden}).*)/", terminal=True)
        triggered = self._rule(" | ".join(after_trigger))
        whole_tag = self._rule(" | ".join(self._format(t, f"{path}.tags[{i}]") for i, t in enumerate(node["tags"])))
        at_least_one, stop_after_first = node.get("at_least_one", False), node.get("stop_after_first", False)
        if at_least_one and stop_after_first:
            return whole_tag
        if at_least_one:
            return self._rule(f"{whole_tag} {triggered}* {tail}?")
        if stop_after_first:
            return self._rule(f"{triggered} | {tail}?")
        return self._rule(f"{triggered}* {tail}?")


def structural_lark(format_: Format) -> str:
    """The Lark grammar of `format_` (its contents `ref` leaves); UnsupportedError names the path
    of a part llguidance cannot be given here."""
    return StructuralLark().lark(format_)


def _free_text_ending_with(ends: list[str], stops: list[str], excludes: list[str]) -> str:
    """A terminal: any text that ends with one of `ends` and holds none of `stops` before that
    end, nor any of `excludes` anywhere."""
    forbidden = f"(?:{_alternatives(stops)})(?s:.)"
    if excludes:
        forbidden = f"{forbidden}|(?:{_alternatives(excludes)})"
    return f"/(?s:.*)(?:{_alternatives(ends)})/ & ~/(?s:.*(?:{forbidden}).*)/"


def _alternatives(texts: list[str]) -> str:
    """`texts` as one regex alternation (inside /.../), longest first."""
    return "|".join(regex_escape(text) for text in sorted(texts, key=len, reverse=True))
