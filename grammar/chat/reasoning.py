"""Think sections: the markers a reasoning model writes around its thinking, and splitting them off.

A constraint with `think_end` set lets the output think freely until that marker (at most
`think_budget` tokens, after which the marker is forced) and applies its grammar after it; the
front end splits the text at the marker with `split_reasoning`. No grammar library here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningMarkers:
    start: str
    end: str


# model family (config.json's model_type) -> its think markers; families not listed do not think
FAMILY_MARKERS = {
    "qwen3": ReasoningMarkers("<think>", "</think>"),
    "qwen3_moe": ReasoningMarkers("<think>", "</think>"),
    "deepseek_v3": ReasoningMarkers("<think>", "</think>"),
}


def markers_for_model(model_type: str | None, chat_template: str | None) -> ReasoningMarkers | None:
    """The family's markers; a template that writes "<think>" (a DeepSeek-R1 distill on a Qwen2 or
    Llama base) thinks too."""
    markers = FAMILY_MARKERS.get(model_type or "")
    if markers is None and chat_template and "</think>" in chat_template:
        markers = ReasoningMarkers("<think>", "</think>")
    return markers


def split_reasoning(text: str, markers: ReasoningMarkers, finished: bool = True) -> tuple[str, str, bool]:
    """(reasoning, answer, whether the end marker was seen) of an output that starts thinking.

    Before the end marker everything is reasoning; while the output is still growing (`finished`
    False), a tail that could be the start of the marker is held back from both parts.
    """
    at = text.find(markers.end)
    if at >= 0:
        return _strip_start(text[:at], markers.start), text[at + len(markers.end):].lstrip("\n"), True
    if not finished:
        if markers.start.startswith(text.lstrip()):  # the start marker may still be coming
            return "", "", False
        text = text[:len(text) - _partial_suffix(text, markers.end)]
    return _strip_start(text, markers.start), "", False


def _strip_start(text: str, start: str) -> str:
    """The reasoning without the start marker (and the newline after it) the model wrote."""
    stripped = text.lstrip()
    if start and stripped.startswith(start):
        return stripped[len(start):].lstrip("\n")
    return text


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
