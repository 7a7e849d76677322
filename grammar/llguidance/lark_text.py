"""The Lark grammars llguidance reads, written as text: literal choices and a think section before
another grammar (tool calls and structural tags: structural_lark.py). Pure text."""
from __future__ import annotations

import json


# what may separate the think end marker from the answer (models write a blank line there)
_AFTER_THINK = r"/\n{0,2}/"


def literal(text: str) -> str:
    """`text` as a Lark string literal (JSON escapes, which llguidance's Lark reads)."""
    return json.dumps(text, ensure_ascii=False)


def choice_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(literal(c) for c in choices) + "\n"


def think_then(answer_rule: str, end_marker: str) -> str:
    """Free thinking up to and including the first `end_marker`, then `answer_rule`. The thinking
    is one lexeme that ends at the marker (llguidance's `&` and `~`: any text with the marker
    only at its end), so the lexer never has to choose where thinking stops."""
    marker = regex_escape(end_marker)
    return (f"start: THINK {_AFTER_THINK} {answer_rule}\n"
            f"THINK: /(?s:.*){marker}/ & ~/(?s:.*{marker}.+)/\n")


def regex_escape(text: str) -> str:
    """`text` literally inside a Lark /regex/ (the slash included)."""
    out = []
    for char in text:
        if char.isalnum() or char in " _-<>=:,;'\"!@#%&~`":
            out.append(char if char not in "&~" else "\\" + char)
        elif char == "\n":
            out.append(r"\n")
        elif char == "\t":
            out.append(r"\t")
        else:
            out.append("\\" + char)
    return "".join(out)
