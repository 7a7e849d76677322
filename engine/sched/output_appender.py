"""After a step: a request's sampled tokens become its output.

Each sampled token is appended as if it came from a step of its own (the grammar accepts it, then
the stop checks and the closing check run); after the last one, the text the grammar forces is
appended at once (jump-forward), for the next step to compute in one pass. The scheduler decides
who runs; this decides what a request's output becomes, and finishes it through the scheduler's
own `finish` when a token ends it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.protocol import ErrorKind
from engine.sched.request import Request, RequestStatus

if TYPE_CHECKING:
    from engine.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)


class OutputAppender:
    def __init__(self, max_model_len: int, structured_output_manager: StructuredOutputManager | None,
                 finish: Callable[[Request, RequestStatus], None],
                 finish_with_error: Callable[[Request, ErrorKind, str], None]) -> None:
        self.max_model_len = max_model_len
        self.structured_output_manager = structured_output_manager
        # the scheduler's: take the request out of its queues and free its KV
        self._finish = finish
        self._finish_with_error = finish_with_error

    def take_sampled(self, request: Request, sampled: list[int]) -> tuple[list[int], int]:
        """Append the sampled tokens (one, or accepted draft tokens and the token after them) as if
        each came from a step of its own: stop checks and the closing check after each, jump-forward
        after the last. Returns the tokens appended and how many of `sampled` are among them."""
        new_token_ids: list[int] = []
        for num_sampled, token_id in enumerate(sampled, 1):
            step_token_ids = self._append_tokens(request, [token_id])
            if not request.is_finished and num_sampled == len(sampled):
                step_token_ids += self._jump_forward(request)
            structured_output = request.structured_output
            if not request.is_finished and structured_output is not None and structured_output.closing is not None:
                step_token_ids += self._close_early(request, step_token_ids)
            new_token_ids += step_token_ids
            if request.is_finished:
                return new_token_ids, num_sampled
        return new_token_ids, len(sampled)

    def _append_tokens(self, request: Request, token_ids: list[int]) -> list[int]:
        """Append tokens one by one, stopping at the first that ends the request."""
        appended = []
        for token_id in token_ids:
            request.append_output_token_ids([token_id])
            appended.append(token_id)
            grammar = request.grammar
            if grammar is not None and not grammar.accept_tokens([token_id]):
                self._finish_with_error(request, ErrorKind.INTERNAL,
                                        f"internal error: the grammar rejected sampled token {token_id}")
                break
            status = request.stop_status(token_id, self.max_model_len)
            if status is not None:
                self._finish(request, status)
                break
        return appended

    def _jump_forward(self, request: Request) -> list[int]:
        """Append the tokens the grammar forces; the next step computes them in one pass."""
        manager = self.structured_output_manager
        structured_output = request.structured_output
        if (manager is None or structured_output is None or structured_output.grammar is None
                or not manager.jump_forward_enabled(structured_output)):
            return []
        grammar = structured_output.grammar
        forced = grammar.jump_forward_token_ids()
        room = request.num_room_tokens(self.max_model_len)
        if len(forced) > room:
            grammar.rollback(len(forced) - room)
            forced = forced[:room]
        if not forced:
            return []
        request.append_output_token_ids(forced)
        structured_output.num_forced_tokens_pending = len(forced)
        request.counters.num_forced_tokens += len(forced)
        status = request.stop_status(forced[-1], self.max_model_len)
        if status is not None:
            self._finish(request, status)
        return forced

    def _close_early(self, request: Request, new_token_ids: list[int]) -> list[int]:
        """Append the closing and finish, when the budget is nearly spent or the output loops
        (grammar/runtime/early_closing.py decides)."""
        structured_output = request.structured_output
        assert structured_output is not None and structured_output.closing is not None
        assert structured_output.grammar is not None  # set with the closing
        found = structured_output.closing.check(new_token_ids, request.num_room_tokens(self.max_model_len))
        if found is None:
            return []
        closing, reason = found
        if not structured_output.grammar.accept_tokens(closing):
            logger.warning("grammar rejected the closing it proposed for %s", request.request_id)
            return []
        request.append_output_token_ids(closing)
        request.counters.num_forced_tokens += len(closing)
        structured_output.closed_early = reason
        self._finish(request, RequestStatus.FINISHED_STOPPED)
        return closing
