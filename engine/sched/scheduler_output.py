"""What crosses from the scheduler to the model runner and back, once per step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.protocol import TokenLogprob


@dataclass
class NewRequestData:
    """A request the runner has not seen (or must rebuild after preemption): sent in full."""

    req_id: str
    token_ids: list[int]  # prompt + any output so far (a resumed request recomputes both)
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int  # prefix-cache hits: KV already in the cache


@dataclass
class CachedRequestData:
    """Requests the runner already holds: only what changed since the last step."""

    req_ids: list[str] = field(default_factory=list)
    # tokens the scheduler appended that the runner did not sample (jump-forward text)
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)  # at the start of this step


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # req_id -> number of tokens computed this step (a prompt chunk, jump-forward text, or 1)
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # requests that finished or were preempted since the last step: the runner drops their state
    finished_req_ids: set[str]
    preempted_req_ids: set[str]
    # req_id -> row in this step's grammar bitmask; only constrained requests that sample this step.
    # A request with a draft has 1 + len(draft) rows from there: its next token, then one per draft token
    structured_output_request_ids: dict[str, int]
    # req_id -> draft tokens scheduled after its own tokens (counted in num_scheduled_tokens), to verify
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]  # every request scheduled this step
    # req_id -> sampled tokens this step; requests mid-prompt (partial prefill) are absent
    sampled_token_ids: dict[str, list[int]]
    # req_id -> logprobs of the sampled token(s), for requests that asked
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
    # requests whose grammar row allowed no token at all: a dead end, never a random token
    dead_end_req_ids: set[str] = field(default_factory=set)
