"""CUDA graphs for decode steps: capture once per shape, then replay padded.

A decode-only step (every scheduled request computes exactly one token) is a few hundred small
kernels for a small model; launching them one by one costs more than running them. Here such a
step is captured once per (batch size, KV blocks) shape and replayed afterwards:

* batch sizes 1, 2, 4, 8, 16, 32, ... up to max_num_seqs (and max_num_seqs itself); a step of n
  requests runs in the smallest size >= n, the extra rows padded;
* KV blocks per request 1, 2, 4, ... up to max_blocks_per_req; the attention gathers that many
  blocks for every row (masked past each row's seq_len), so short contexts stay cheap.

Padding rows write their K/V to slot 0 of block 0, which the block pool never hands out
(engine/kv_cache/block_pool.py), attend only to that slot, and their logits are dropped.

The graphs read their inputs from static device buffers owned here; `run` copies the step's
numbers in (from pinned host buffers, without blocking) and replays. Graphs are captured lazily,
the first time a shape is needed (tens of milliseconds each), all into one memory pool; replays
are sequential and each graph's output is kept alive, so sharing the pool is safe.

With `capture=False` the same padded static-buffer forward runs eagerly: that is how the padding
logic is tested on the CPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import AttentionBackend
from engine.models.decoder import DecoderForCausalLM

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, ... below max_num_seqs, then max_num_seqs."""
    sizes, size = [], 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return sizes + [max_num_seqs]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None when running eagerly (capture=False)
    logits: torch.Tensor | None  # the graph's output buffer [batch size, vocab] float32


class DecodeGraphRunner:
    """Decode steps through captured CUDA graphs (or the same padded forward, eagerly)."""

    def __init__(self, model: DecoderForCausalLM, kv_caches: list[torch.Tensor], attn_backend: AttentionBackend,
                 max_num_seqs: int, max_blocks_per_req: int, block_size: int, device: torch.device,
                 capture: bool = True) -> None:
        if not attn_backend.supports_decode_metadata:
            raise ValueError(f"{type(attn_backend).__name__} cannot build decode metadata from device tensors")
        self.model, self.kv_caches, self.attn_backend = model, kv_caches, attn_backend
        self.block_size = block_size
        self.batch_sizes = capture_sizes(max_num_seqs)
        self.block_counts = capture_sizes(max_blocks_per_req)
        self.capture = capture
        max_bs = self.batch_sizes[-1]
        pin = capture and device.type == "cuda"
        # static inputs of every graph (a graph of batch size b reads the first b rows)
        self._input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self._positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self._slot_mapping = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self._seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self._block_table = torch.zeros(max_bs, max_blocks_per_req, dtype=torch.int32, device=device)
        self._logits_indices = torch.arange(max_bs, dtype=torch.int64, device=device)
        # host staging: one row per request, padding already in place
        self._host_tokens = torch.zeros(4, max_bs, dtype=torch.int64, pin_memory=pin)  # ids, positions, slots, lens
        self._host_blocks = torch.zeros(max_bs, max_blocks_per_req, dtype=torch.int32, pin_memory=pin)
        self._pinned = pin
        self._copied: torch.cuda.Event | None = None  # recorded after the copies out of the pinned buffers
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_runs = 0  # decode steps run here (replayed or eager)

    def padded_batch_size(self, num_reqs: int) -> int | None:
        """The captured size a step of num_reqs decodes runs at; None: too many, run eagerly."""
        for size in self.batch_sizes:
            if size >= num_reqs:
                return size
        return None

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray, seq_lens: np.ndarray,
            block_table: np.ndarray) -> torch.Tensor:
        """One decode step of n requests (one token each; block_table: their [n, max_blocks] rows).

        Returns logits [n, vocab] float32: a view of the graph's output buffer, valid until the next
        `run` (the sampler reads it before then).
        """
        n = len(input_ids)
        batch_size = self.padded_batch_size(n)
        if batch_size is None:
            raise ValueError(f"{n} decodes exceed the largest captured batch size {self.batch_sizes[-1]}")
        needed = -(-int(seq_lens.max()) // self.block_size)
        num_blocks = next(c for c in self.block_counts if c >= needed)
        if self._copied is not None:  # the last step's copies out of the staging buffers are done
            self._copied.synchronize()
        staged = self._host_tokens.numpy()
        staged[:, n:batch_size] = ((0,), (0,), (0,), (1,))  # padding: token 0 at slot 0, one key
        staged[0, :n], staged[1, :n], staged[2, :n], staged[3, :n] = input_ids, positions, slot_mapping, seq_lens
        blocks = self._host_blocks.numpy()
        blocks[:n] = block_table
        blocks[n:batch_size] = 0
        for buffer, row in zip((self._input_ids, self._positions, self._slot_mapping, self._seq_lens),
                               self._host_tokens[:, :batch_size]):
            buffer[:batch_size].copy_(row, non_blocking=True)
        self._block_table[:batch_size].copy_(self._host_blocks[:batch_size], non_blocking=True)
        if self._pinned:
            self._copied = torch.cuda.Event()
            self._copied.record()
        graph = self._graphs.get((batch_size, num_blocks))
        if graph is None:
            graph = self._graphs[(batch_size, num_blocks)] = self._capture(batch_size, num_blocks)
        if graph.graph is None:
            logits = self._forward(batch_size, num_blocks)
        else:
            graph.graph.replay()
            logits = graph.logits
        self.num_runs += 1
        return logits[:n]

    @torch.inference_mode()
    def capture_all(self, max_num_blocks: int) -> int:
        """Capture every batch size for every block count up to max_num_blocks now (benchmarks:
        keeps capture time out of the figures). Returns the number of graphs held.

        Every row is padding meanwhile: a warm-up forward over stale rows would write K/V into
        slots that may belong to other requests by now."""
        for buffer, value in ((self._input_ids, 0), (self._positions, 0), (self._slot_mapping, 0),
                              (self._seq_lens, 1), (self._block_table, 0)):
            buffer.fill_(value)
        for num_blocks in [c for c in self.block_counts if c <= max_num_blocks]:
            for batch_size in self.batch_sizes:
                if (batch_size, num_blocks) not in self._graphs:
                    self._graphs[(batch_size, num_blocks)] = self._capture(batch_size, num_blocks)
        return len(self._graphs)

    def _forward(self, batch_size: int, num_blocks: int) -> torch.Tensor:
        metadata = self.attn_backend.decode_metadata(
            self._slot_mapping[:batch_size], self._block_table[:batch_size, :num_blocks], self._seq_lens[:batch_size])
        return self.model(self._input_ids[:batch_size], self._positions[:batch_size], self.kv_caches,
                          self.attn_backend, metadata, self._logits_indices[:batch_size])

    def _capture(self, batch_size: int, num_blocks: int) -> _Graph:
        if not self.capture:
            return _Graph(None, None)
        # warm up on a side stream first (cuBLAS handles, lazy inits), as torch's capture recipe says
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(batch_size, num_blocks)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine thread may use CUDA (bitmask copies) while the worker captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self._forward(batch_size, num_blocks)
        logger.debug("captured a decode graph: batch %d, %d KV blocks", batch_size, num_blocks)
        return _Graph(graph, logits)
