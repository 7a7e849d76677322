"""What the speculator remembers about one request's drafts between steps."""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.spec_decode.acceptance_rate import AcceptanceRate

if TYPE_CHECKING:
    from engine.spec_decode.text_drafter import PromptText


class DraftState:
    """One request's drafting: kept by the Speculator from the request's first proposal until it
    finishes; nothing else reads or writes it."""

    __slots__ = ("num_rejected_drafts", "draft_pause_steps", "draft_acceptance", "draft_ngram", "copy_offset",
                 "draft_begin", "copy_anchor", "prompt_text", "text_anchor", "draft_text_ends")

    def __init__(self) -> None:
        self.num_rejected_drafts = 0  # drafts in a row rejected at their first token
        self.draft_pause_steps = 0  # steps left before it drafts again
        self.draft_acceptance = AcceptanceRate()  # of its recent drafts: how long the next one is
        # its last draft's acceptance key: the n-gram length it followed, or a COPY_/TEXT_ key
        self.draft_ngram = 0
        self.copy_offset = 0  # its last draft's source: this many tokens behind its end (< 0; 0: none)
        self.draft_begin = 0  # where in its tokens its last draft was read
        self.copy_anchor = 0  # the prompt token after the last one its output copied (accepted drafts)
        self.prompt_text: PromptText | None = None  # its prompt's bytes, joined when it first drafts by text
        self.text_anchor = 0  # the prompt byte after the last one its output copied (accepted drafts)
        self.draft_text_ends: list[int] = []  # its last draft read from text: each token's end in the prompt
