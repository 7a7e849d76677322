"""What the scheduler asks of speculative decoding: a draft for a request, and what became of it.

The scheduler plans who drafts and verifies drafts; how a draft is found and how long it is are the
speculator's (engine/spec_decode/speculator.py), which keeps its own per-request state.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.sched.request import Request


class Drafter(ABC):
    """Driven from the engine thread only, by the scheduler, in this order each step: `begin_step`,
    `propose` for each running request that samples, `record` for each verified draft; `forget`
    once a request finishes."""

    @abstractmethod
    def begin_step(self, num_running: int) -> bool:
        """A new step plan with `num_running` running requests; False when nobody may draft in it
        (the scheduler then asks no one)."""

    @abstractmethod
    def propose(self, request: Request, max_tokens: int, num_running: int, stop_at_forced: bool) -> list[int]:
        """A draft of at most `max_tokens` tokens to verify after the request's tokens ([] if it
        should not draft now). `stop_at_forced`: jump-forward is on for the request. The request
        (its grammar included) is left as it was."""

    @abstractmethod
    def record(self, request: Request, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """The request's draft was verified: `num_accepted_tokens` of its `num_draft_tokens` kept."""

    @abstractmethod
    def forget(self, request_id: str) -> None:
        """The request finished: drop what was kept about it."""
