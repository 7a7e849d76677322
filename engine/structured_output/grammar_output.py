"""The token bitmask of one step, from the structured-output manager to the sampler."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class GrammarOutput:
    """The token bitmask of this step, filled on the CPU while the forward pass runs."""

    # req_id -> row of `grammar_bitmask`
    structured_output_request_ids: dict[str, int]
    grammar_bitmask: torch.Tensor  # int32 [num_rows, ceil(vocab_size / 32)], 1 bit = allowed
    # req_id -> why its fill failed or ran past max_fill_ms; the scheduler ends these requests
    failed: dict[str, str] = field(default_factory=dict)
    # requests whose row is filled off the engine thread (a lazily compiled grammar): in place
    # once StructuredOutputManager.finish_bitmask has run, after the forward
    lazy_req_ids: list[str] = field(default_factory=list)
    # of those, the ones whose fill was still running then: they skip this step's sample
    deferred: set[str] = field(default_factory=set)
