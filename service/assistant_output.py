"""An assistant's output read back: the think section, the answer's text, and its tool calls.

`split` reads a whole output; `AssistantStream` reads one as it grows and hands out what each step
adds, never taking back what it handed out: text that may still turn into a marker or a call (a
partial `</think>` or `<tool_call>`, a call not closed yet) is held back until it is decided, and a
call is handed out whole once it is complete.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grammar.reasoning import split_reasoning

if TYPE_CHECKING:
    from service.chat_format import OutputShape


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class AssistantParts:
    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def split(text: str, shape: OutputShape) -> AssistantParts:
    """A finished output's parts (content stripped of the whitespace around calls)."""
    reasoning, answer = _think(text, shape, finished=True)
    if shape.tool_syntax is None:
        return AssistantParts(reasoning, answer)
    content, calls = shape.tool_syntax.parse(answer)
    return AssistantParts(reasoning, content, [ParsedCall(_call_id(), name, args) for name, args in calls])


class AssistantStream:
    """One choice's output as it grows; `step(text, finished)` -> what it adds."""

    def __init__(self, shape: OutputShape) -> None:
        self.shape = shape
        self._num_reasoning = 0  # characters handed out so far
        self._num_content = 0
        self.num_calls = 0  # calls handed out so far

    def step(self, text: str, finished: bool) -> AssistantParts:
        """`text`: the whole output so far."""
        reasoning, answer = _think(text, self.shape, finished)
        content, calls = answer, []
        syntax = self.shape.tool_syntax
        if syntax is not None:
            content, calls, broken = syntax.scan(answer)
            if not finished:
                content, calls, _ = syntax.scan(answer[:_decided(answer, syntax.trigger, broken)])
        added = AssistantParts(reasoning[self._num_reasoning:], content[self._num_content:],
                               [ParsedCall(_call_id(), name, args) for name, args in calls[self.num_calls:]])
        self._num_reasoning = max(self._num_reasoning, len(reasoning))
        self._num_content = max(self._num_content, len(content))
        self.num_calls = max(self.num_calls, len(calls))
        return added


def _think(text: str, shape: OutputShape, finished: bool) -> tuple[str, str]:
    if shape.reasoning is None:
        return "", text
    reasoning, answer, _ = split_reasoning(text, shape.reasoning, finished)
    return reasoning, answer


def _decided(text: str, trigger: str, broken: int | None) -> int:
    """The length of a growing answer's part that can no longer become a call: up to a call that
    has begun and is not complete yet, or to a tail that may be the start of the trigger."""
    if broken is not None:
        return broken
    for size in range(min(len(trigger) - 1, len(text)), 0, -1):
        if trigger.startswith(text[-size:]):
            return len(text) - size
    return len(text)


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)
