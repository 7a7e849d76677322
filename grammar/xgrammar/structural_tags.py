"""What xgrammar's structural-tag JSON (`{"type": "structural_tag", "format": {...}}`) adds to the
library-free format trees (a structural_tag constraint's, grammar/chat/structural_tag.py; tool
calls', grammar/chat/tool_call_format.py): a compiled grammar as a format, and a think section
before an answer: free text (at most `budget` tokens, then the end marker is forced) up to the end
marker, then the answer. Built without the library.
"""
from __future__ import annotations

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


def grammar_format(ebnf: str) -> Format:
    return {"type": "grammar", "grammar": ebnf}


def structural_tag(format_: Format) -> dict[str, Any]:
    return {"type": "structural_tag", "format": format_}
