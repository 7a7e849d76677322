"""Flat step inputs against hand-computed arrays."""
from __future__ import annotations

import numpy as np
import torch

from engine.worker.input_batch import prepare_step_indices


def test_scheduled_tokens_2_5_3():
    block_size = 4
    # three requests in batch rows 2, 0, 1 with 3, 0 and 6 tokens already cached
    rows = np.array([2, 0, 1])
    num_scheduled = np.array([2, 5, 3], dtype=np.int32)
    num_computed = np.array([3, 0, 6], dtype=np.int32)
    token_ids = np.arange(3 * 16, dtype=np.int32).reshape(3, 16) + 1000  # row r, position p -> 1000 + 16r + p
    block_table = np.array([[7, 8, 0, 0], [3, 4, 5, 0], [9, 2, 0, 0]], dtype=np.int32)

    s = prepare_step_indices(rows, num_scheduled, num_computed, token_ids, block_table, block_size)

    assert s.req_indices.tolist() == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert s.positions.tolist() == [3, 4, 0, 1, 2, 3, 4, 6, 7, 8]
    assert s.input_ids.tolist() == [1035, 1036, 1000, 1001, 1002, 1003, 1004, 1022, 1023, 1024]
    # row 2 (blocks 9, 2): pos 3 -> 9*4+3, pos 4 -> 2*4+0; row 0 (blocks 7, 8): pos 0..4;
    # row 1 (blocks 3, 4, 5): pos 6 -> 4*4+2, 7 -> 4*4+3, 8 -> 5*4+0
    assert s.slot_mapping.tolist() == [39, 8, 28, 29, 30, 31, 32, 18, 19, 20]
    assert s.query_start_loc.tolist() == [0, 2, 7, 10]
    assert s.seq_lens.tolist() == [5, 5, 9]
    assert s.logits_indices.tolist() == [1, 6, 9]


def test_all_decodes():
    rows = np.array([0, 1])
    s = prepare_step_indices(rows, np.array([1, 1], dtype=np.int32), np.array([5, 16], dtype=np.int32),
                             np.arange(64, dtype=np.int32).reshape(2, 32), np.array([[1, 0], [2, 3]], dtype=np.int32), 16)
    assert s.positions.tolist() == [5, 16]
    assert s.input_ids.tolist() == [5, 48]
    assert s.slot_mapping.tolist() == [16 + 5, 3 * 16]
    assert s.logits_indices.tolist() == [0, 1]


def make_batch():
    from engine.worker.input_batch import InputBatch
    return InputBatch(max_num_reqs=2, max_model_len=32, max_blocks_per_req=2)


def test_a_preempted_seeded_request_resumes_its_generator():
    from engine.sampling_params import SamplingParams
    batch = make_batch()
    params = SamplingParams(temperature=1.0, seed=5)
    batch.add_request("a", [1, 2, 3], 3, params, [1], 0)
    generator = batch.requests["a"].generator
    torch.rand(4, generator=generator)  # the stream moves on
    batch.remove_request("a", preempted=True)
    assert "a" not in batch.requests
    batch.add_request("a", [1, 2, 3, 9], 3, params, [2], 0)
    assert batch.requests["a"].generator is generator
    fresh = torch.Generator().manual_seed(5)
    torch.rand(4, generator=fresh)
    assert torch.equal(torch.rand(4, generator=generator), torch.rand(4, generator=fresh))


def test_a_finished_request_drops_its_generator_even_while_preempted():
    from engine.sampling_params import SamplingParams
    batch = make_batch()
    params = SamplingParams(temperature=1.0, seed=5)
    batch.add_request("a", [1, 2], 2, params, [1], 0)
    torch.rand(4, generator=batch.requests["a"].generator)
    batch.remove_request("a", preempted=True)
    batch.remove_request("a")  # aborted while waiting to resume
    batch.add_request("a", [1, 2], 2, params, [1], 0)  # the id comes back as a new request: a fresh stream
    assert torch.equal(torch.rand(4, generator=batch.requests["a"].generator),
                       torch.rand(4, generator=torch.Generator().manual_seed(5)))
    assert len(batch.requests) == 1 and len(batch._free_rows) == 1  # the row was freed and reused
