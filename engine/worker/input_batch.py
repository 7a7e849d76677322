"""The runner's persistent view of its requests: one row each, kept across steps.

Only the diff in each SchedulerOutput is applied, so a decode step touches a few numbers per
request instead of rebuilding the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    num_prompt_tokens: int
    sampling_params: SamplingParams
    generator: torch.Generator | None  # seeded requests sample from their own stream
    row: int


@dataclass
class StepIndices:
    """Flat per-token arrays of one step (no padding). Built by `prepare_step_indices`."""

    req_indices: np.ndarray  # [num_tokens] which scheduled request each token belongs to
    positions: np.ndarray  # [num_tokens] position of each token in its request
    input_ids: np.ndarray  # [num_tokens]
    slot_mapping: np.ndarray  # [num_tokens] KV cache slot: block_id * block_size + offset
    query_start_loc: np.ndarray  # [num_reqs + 1]
    seq_lens: np.ndarray  # [num_reqs] tokens in the cache after this step
    logits_indices: np.ndarray  # [num_reqs] last scheduled token of each request


def prepare_step_indices(rows: np.ndarray, num_scheduled_tokens: np.ndarray, num_computed_tokens: np.ndarray,
                         token_ids: np.ndarray, block_table: np.ndarray, block_size: int) -> StepIndices:
    """Pure function: scheduled requests (batch rows, token counts, cached counts) -> flat inputs.

    rows, num_scheduled_tokens, num_computed_tokens: [num_reqs], in scheduling order.
    token_ids: [max_num_reqs, max_model_len]; block_table: [max_num_reqs, max_blocks_per_req].
    """
    num_reqs = len(rows)
    cu_num_tokens = np.cumsum(num_scheduled_tokens, dtype=np.int64)
    total = int(cu_num_tokens[-1]) if num_reqs else 0
    req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), num_scheduled_tokens)
    offsets_in_req = np.arange(total, dtype=np.int64) - np.repeat(cu_num_tokens - num_scheduled_tokens,
                                                                   num_scheduled_tokens)
    positions = np.repeat(num_computed_tokens.astype(np.int64), num_scheduled_tokens) + offsets_in_req
    token_rows = rows[req_indices]
    input_ids = token_ids[token_rows, positions]
    slot_mapping = block_table[token_rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    query_start_loc[1:] = cu_num_tokens
    seq_lens = (num_computed_tokens + num_scheduled_tokens).astype(np.int32)
    return StepIndices(req_indices, positions, input_ids, slot_mapping, query_start_loc, seq_lens,
                       cu_num_tokens - 1)


class InputBatch:
    """CPU arrays indexed by row; rows are reused after a request leaves."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)
        self.requests: dict[str, CachedRequestState] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))
        # req_id -> the generator of a preempted seeded request: its stream continues where it
        # stopped when the request resumes, so preemption never changes a seeded request's tokens
        self._preempted_generators: dict[str, torch.Generator] = {}

    def add_request(self, req_id: str, token_ids: list[int], num_prompt_tokens: int,
                    sampling_params: SamplingParams, block_ids: list[int], num_computed_tokens: int) -> None:
        if not self._free_rows:
            raise RuntimeError(f"input batch is full ({self.max_num_reqs} rows)")
        row = self._free_rows.pop()
        n = len(token_ids)
        self.token_ids[row, :n] = token_ids
        self.num_tokens[row] = n
        self.num_computed_tokens[row] = num_computed_tokens
        self.num_blocks[row] = 0
        self.append_block_ids(row, block_ids)
        generator = self._preempted_generators.pop(req_id, None)
        if generator is None and sampling_params.seed is not None:
            generator = torch.Generator().manual_seed(sampling_params.seed)
        self.requests[req_id] = CachedRequestState(req_id, num_prompt_tokens, sampling_params, generator, row)

    def remove_request(self, req_id: str, preempted: bool = False) -> None:
        """Free the request's row. A preempted request keeps its generator until it resumes or finishes."""
        state = self.requests.pop(req_id, None)
        if not preempted:
            self._preempted_generators.pop(req_id, None)
        if state is None:
            return
        self._free_rows.append(state.row)
        if preempted and state.generator is not None:
            self._preempted_generators[req_id] = state.generator

    def append_block_ids(self, row: int, block_ids: list[int]) -> None:
        start = self.num_blocks[row]
        self.block_table[row, start:start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def append_token_ids(self, row: int, token_ids: list[int]) -> None:
        start = self.num_tokens[row]
        self.token_ids[row, start:start + len(token_ids)] = token_ids
        self.num_tokens[row] = start + len(token_ids)

    def output_token_ids(self, req_id: str) -> np.ndarray:
        state = self.requests[req_id]
        return self.token_ids[state.row, state.num_prompt_tokens:self.num_tokens[state.row]]

    def all_token_ids(self, req_id: str) -> np.ndarray:
        state = self.requests[req_id]
        return self.token_ids[state.row, :self.num_tokens[state.row]]
