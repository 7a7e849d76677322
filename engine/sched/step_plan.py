"""What one schedule() call plans, and the per-step metadata read from it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.sched.scheduler_output import CachedRequestData, NewRequestData

if TYPE_CHECKING:
    from engine.sched.request import Request


@dataclass
class StepPlan:
    """What one schedule() call has planned so far."""

    token_budget: int  # tokens still free this step
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # req_id -> tokens this step
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)  # req_id -> draft (in its tokens)
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached: CachedRequestData = field(default_factory=CachedRequestData)
    may_draft: bool = False  # few enough run for drafts to pay: else no request is even looked up

    def add(self, req_id: str, num_new: int) -> None:
        self.num_scheduled_tokens[req_id] = num_new
        self.token_budget -= num_new


def bitmask_rows(plan: StepPlan, requests: dict[str, Request]) -> dict[str, int]:
    """req_id -> first grammar bitmask row, for the constrained requests that sample this step
    (1 + len(draft) rows each). Read before the plan's tokens count as computed."""
    rows: dict[str, int] = {}
    num_rows = 0
    for req_id, num_new in plan.num_scheduled_tokens.items():
        request = requests[req_id]
        num_draft = len(plan.spec_token_ids.get(req_id, ()))
        if request.grammar is not None and request.num_computed_tokens + num_new - num_draft == request.num_tokens:
            rows[req_id] = num_rows
            num_rows += 1 + num_draft
    return rows
