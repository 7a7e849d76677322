"""What xgrammar's structural-tag JSON (`{"type": "structural_tag", "format": {...}}`) adds to the
library-free format trees (a structural_tag constraint's, grammar/chat/structural_tag.py; tool
calls', grammar/chat/tool_call_format.py): a compiled grammar as a format, and a think section
before an answer: free text (at most `budget` tokens, then the end marker is forced) up to the end
marker, then the answer. Built without the library.
"""
from __future__ import annotations

import re
from typing import Any

Format = dict[str, Any]
# what may separate the think end marker from the answer (models write a blank line there)
_AFTER_THINK = {"type": "regex", "pattern": r"\n{0,2}"}


def think_then(answer: Format, end_marker: str, budget: int) -> Format:
    """Free thinking up to `end_marker` (at most `budget` tokens; 0: no limit), then `answer`."""
    thinking: Format = {"type": "any_text"}
    if budget:
        thinking["max_tokens"] = budget
    think = {"type": "tag", "begin": "", "content": thinking, "end": end_marker}
    return {"type": "sequence", "elements": [think, _AFTER_THINK, answer]}


def constrained_think_then(answer: Format, thinking: Format, start_marker: str, end_marker: str) -> Format:
    """`thinking` (a format) between an optional `start_marker` (the model may write it, or the
    prompt may already end with it) and `end_marker`, then `answer`."""
    elements: list[Format] = []
    if start_marker:
        elements.append({"type": "regex", "pattern": f"({re.escape(start_marker)}\\n{{0,2}})?"})
    elements += [thinking, {"type": "const_string", "value": end_marker}, _AFTER_THINK, answer]
    return {"type": "sequence", "elements": elements}


def grammar_format(ebnf: str) -> Format:
    return {"type": "grammar", "grammar": ebnf}


def structural_tag(format_: Format) -> dict[str, Any]:
    return {"type": "structural_tag", "format": format_}
