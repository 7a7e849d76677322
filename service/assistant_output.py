"""An assistant's output read back: the think section, the answer's text, and its tool calls.

`split` reads a whole output; `AssistantStream` reads one as it grows and hands out what each step
adds, never taking back what it handed out: text that may still turn into a marker or a call (a
partial `</think>` or `<tool_call>`) is held back until it is decided. A call is streamed as OpenAI
streams one: a first delta with its id and name once the name is written, then its arguments' text
as it is generated, which adds up to the `arguments` that `split` reads from the whole output.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grammar.chat.reasoning import split_reasoning

if TYPE_CHECKING:
    from grammar.chat.reasoning import ReasoningMarkers
    from grammar.chat.tool_calls import CallSyntax


@dataclass(frozen=True)
class OutputShape:
    """How one request's output is read back (set by service/chat_format.py)."""

    tool_syntax: CallSyntax | None = None  # set: calls are parsed out of the answer
    reasoning: ReasoningMarkers | None = None  # set: the output starts with a think section
    # with `reasoning`: the output is a think section only if it opens with the start marker (a
    # constraint over the whole output decides whether it writes one); otherwise all of it is answer
    think_if_opened: bool = False

    @property
    def plain(self) -> bool:
        return self.tool_syntax is None and self.reasoning is None


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class CallDelta:
    """What one step adds to call `index`: its first delta carries `id` and `name` (arguments
    ""), later ones the next piece of its arguments' text."""

    index: int
    arguments: str = ""
    id: str = ""
    name: str = ""


@dataclass
class AssistantParts:
    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    call_deltas: list[CallDelta] = field(default_factory=list)  # streaming: what the step adds to calls


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
        self.call_ids: list[str] = []  # of the calls handed out so far, in order
        self._num_arguments: list[int] = []  # characters of each call's arguments handed out

    @property
    def num_calls(self) -> int:
        return len(self.call_ids)

    def step(self, text: str, finished: bool) -> AssistantParts:
        """`text`: the whole output so far. The parts' `calls` stay empty: calls come as `call_deltas`."""
        reasoning, answer = _think(text, self.shape, finished)
        content, calls = answer, []
        syntax = self.shape.tool_syntax
        if syntax is not None:
            content, calls, broken = syntax.scan(answer)
            begun = [] if broken is None else syntax.partial_calls(answer, broken)
            if not finished or begun:  # a call under way (even one cut by max_tokens) is not text
                content, calls, _ = syntax.scan(answer[:_decided(answer, syntax.trigger, broken)])
                calls += begun
        added = AssistantParts(reasoning[self._num_reasoning:], content[self._num_content:])
        self._num_reasoning = max(self._num_reasoning, len(reasoning))
        self._num_content = max(self._num_content, len(content))
        for index, (name, arguments) in enumerate(calls):
            if index == len(self.call_ids):
                self.call_ids.append(_call_id())
                self._num_arguments.append(0)
                added.call_deltas.append(CallDelta(index, id=self.call_ids[index], name=name))
            if len(arguments) > self._num_arguments[index]:
                added.call_deltas.append(CallDelta(index, arguments[self._num_arguments[index]:]))
                self._num_arguments[index] = len(arguments)
        return added

    def final_parts(self, text: str) -> AssistantParts:
        """The finished output's parts (as `split` reads them) with the ids the stream handed out."""
        parts = split(text, self.shape)
        parts.calls = [ParsedCall(self.call_ids[i], c.name, c.arguments) if i < len(self.call_ids) else c
                       for i, c in enumerate(parts.calls)]
        return parts


def _think(text: str, shape: OutputShape, finished: bool) -> tuple[str, str]:
    if shape.reasoning is None:
        return "", text
    if shape.think_if_opened:
        opening = text.lstrip()
        if not finished and shape.reasoning.start.startswith(opening):  # the start marker may still be coming
            return "", ""
        if not opening.startswith(shape.reasoning.start):
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
