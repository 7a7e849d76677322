"""The worker side: applies each SchedulerOutput diff, runs the forward, samples.

`execute_model` computes logits only at `logits_indices` and parks them; `sample_tokens` applies
the grammar bitmask and samples, then writes the sampled tokens into the runner's own token
cache (the scheduler never sends sampled tokens back).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.attention import AttentionInputs, get_attention_backend
from engine.config import EngineConfig, model_eos_token_ids
from engine.model_files import gguf_weights_file
from engine.models import model_class
from engine.models.gguf_loader import load_quantized_gguf
from engine.sched.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.structured_output.grammar_output import GrammarOutput
from engine.worker.draft_verification import draft_logits_indices, num_accepted
from engine.worker.input_batch import CachedRequestState, InputBatch, prepare_step_indices
from engine.worker.sampler import Sampler, SamplingMetadata

logger = logging.getLogger(__name__)


@dataclass
class _ParkedLogits:
    req_ids: list[str]  # every request of the step, in order
    sampling_req_ids: list[str]  # those that sample (their catch-up completes this step)
    num_draft_tokens: list[int]  # per sampling request: draft tokens verified (logits rows: 1 + that)
    drafts: dict[str, list[int]]  # req_id -> its draft
    logits: torch.Tensor  # [sum(1 + num_draft_tokens), vocab]


def _without(parked: _ParkedLogits, req_ids: set[str]) -> _ParkedLogits:
    """The parked logits less the rows of `req_ids` (they do not sample this step)."""
    keep, rows, start = [], [], 0
    for req_id, num_draft in zip(parked.sampling_req_ids, parked.num_draft_tokens):
        if req_id not in req_ids:
            keep.append((req_id, num_draft))
            rows.extend(range(start, start + 1 + num_draft))
        start += 1 + num_draft
    logits = parked.logits[torch.tensor(rows, dtype=torch.long, device=parked.logits.device)]
    return _ParkedLogits(parked.req_ids, [r for r, _ in keep], [n for _, n in keep], parked.drafts, logits)


@contextlib.contextmanager
def _no_weight_init():
    """Layers built without their random initialisation: the weights are read in afterwards, and
    on the meta device torch runs the init through its reference ops, which import torch._dynamo
    and triton (~150 MiB of a process's memory, and seconds of start-up) for nothing."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "trunc_normal_", "xavier_uniform_")
    saved = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_dir: Path, hf_config, max_model_len: int) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = getattr(torch, config.torch_dtype)
        self.max_model_len = max_model_len
        self.block_size = config.cache.block_size
        # built without storage, then given empty storage in the served dtype: the weights exist
        # once, as they are read (engine/models/weight_loader.py), never as an fp32 copy first
        with torch.device("meta"), _no_weight_init():
            model = model_class(hf_config)(hf_config, max_model_len)
        self.model = self._load_weights(model, model_dir)
        self.vocab_size = hf_config.vocab_size
        # the ids that end an output unless ignore_eos: min_tokens bans them until it is reached
        self.eos_token_ids = np.array(model_eos_token_ids(model_dir), dtype=np.int64)
        self.attn_backend = get_attention_backend(self.device, self.block_size, config.cuda.attention_backend)
        self.kv_dtype = self.attn_backend.kv_cache_dtype(self.dtype)
        self.num_blocks = self._determine_num_blocks(hf_config)
        layer = self.model.layers[0]
        self.kv_caches = self.attn_backend.allocate_kv_cache(
            len(self.model.layers), self.num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim,
            self.kv_dtype, self.device)
        max_blocks_per_req = -(-max_model_len // self.block_size)
        self.input_batch = InputBatch(config.scheduler.max_num_seqs, max_model_len, max_blocks_per_req)
        # on CUDA, decode-only steps replay captured graphs (engine/worker/cuda_graph.py) unless enforce_eager
        self.decode_graphs = None
        if self.device.type == "cuda" and not config.cuda.enforce_eager:
            from engine.worker.cuda_graph import DecodeGraphRunner
            self.decode_graphs = DecodeGraphRunner(self.model, self.kv_caches, self.attn_backend,
                                                   config.scheduler.max_num_seqs, max_blocks_per_req,
                                                   self.block_size, self.device)
        self.sampler = Sampler()
        self._parked: _ParkedLogits | None = None
        self.last_forward_s = 0.0  # wall time of the last execute_model (benchmarks)
        self.last_forward_cpu_s = 0.0  # its thread's CPU time: the forward's own, whatever else runs on the machine

    def _load_weights(self, model, model_dir: Path):
        """The model built on the meta device, with its weights: read from the folder (then packed, or
        quantized to int8), or from the GGUF file a folder prepared for Q8_0 or 4-bit weights names."""
        config = self.config
        logger.info("dtype %s", config.dtype_choice)
        if (gguf := gguf_weights_file(model_dir)) is not None:
            logger.info("weights read from %s: Q8_0 matmuls as int8, 4-bit ones in 4-bit, with the file's block scales",
                        gguf.name)
            return load_quantized_gguf(model, gguf, self.dtype).eval()
        model = model.to(self.dtype).to_empty(device=self.device)
        model.load_weights(model_dir)
        model.eval()
        if config.quantization is not None:
            quantized = model.quantize_cpu_weights(config.quantize_lm_head, config.quantization_lenient)
            logger.info("%d weight matrices quantized once to int8 (per-channel scales) for the CPU kernels",
                        quantized)
        elif packed := model.pack_cpu_weights(_torch_dtype(config.cpu_weight_torch_dtype)):
            logger.info("%d weight matrices packed once for the CPU kernels' %s matmuls", packed, config.torch_dtype)
        return model

    def _determine_num_blocks(self, hf_config) -> int:
        if self.config.cache.num_blocks is not None:
            return self.config.cache.num_blocks
        layer = self.model.layers[0]
        bytes_per_block = (2 * len(self.model.layers) * self.block_size * layer.num_kv_heads * layer.head_dim
                           * torch.finfo(self.kv_dtype).bits // 8)
        if self.device.type == "cuda":  # what gpu_memory_utilization leaves (engine/worker/device_memory.py)
            from engine.worker.device_memory import StepShape, num_blocks_from_free_memory
            sched = self.config.scheduler
            shape = StepShape(sched.max_num_seqs, sched.max_num_batched_tokens, self.max_model_len,
                              hf_config.hidden_size, layer.intermediate_size, layer.num_heads, layer.num_kv_heads,
                              layer.head_dim, hf_config.vocab_size, torch.finfo(self.dtype).bits // 8)
            return num_blocks_from_free_memory(self.device, self.config.cuda.gpu_memory_utilization,
                                               bytes_per_block, shape)
        return max(2, self.config.cache.kv_cache_bytes // bytes_per_block)

    # ---- the step --------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        """Forward the scheduled tokens and park the logits of the requests that sample."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        self._execute_model(scheduler_output)
        self.last_forward_s = time.perf_counter() - start
        self.last_forward_cpu_s = time.thread_time() - start_cpu

    @torch.inference_mode()
    def _execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self._update_states(scheduler_output)
        if scheduler_output.is_empty:
            self._parked = _ParkedLogits([], [], [], {}, torch.empty(0, self.vocab_size))
            return None
        batch = self.input_batch
        req_ids = list(scheduler_output.num_scheduled_tokens)
        rows = np.fromiter((batch.requests[r].row for r in req_ids), dtype=np.int64, count=len(req_ids))
        num_scheduled = np.fromiter(scheduler_output.num_scheduled_tokens.values(), dtype=np.int32,
                                    count=len(req_ids))
        num_computed = batch.num_computed_tokens[rows]
        drafts = scheduler_output.scheduled_spec_decode_tokens
        num_draft = self._write_drafts(drafts, req_ids, rows)
        step = prepare_step_indices(rows, num_scheduled, num_computed, batch.token_ids, batch.block_table,
                                    self.block_size)
        batch.num_computed_tokens[rows] += num_scheduled
        # a request samples when its catch-up completes this step (not mid-prompt)
        samples = step.seq_lens == batch.num_tokens[rows] + num_draft
        sampling_req_ids = [r for r, s in zip(req_ids, samples) if s]
        num_draft_sampling = num_draft[samples].tolist()
        logits_indices = step.logits_indices[samples]
        if drafts:
            logits_indices = draft_logits_indices(logits_indices, num_draft[samples])
        graphs = self.decode_graphs  # a decode-only step on CUDA replays a graph, padded to a captured size
        if graphs is not None and (num_scheduled == 1).all() and graphs.padded_batch_size(len(rows)) is not None:
            logits = graphs.run(step.input_ids, step.positions, step.slot_mapping, step.seq_lens,
                                batch.block_table[rows])
            if not samples.all():  # a one-token prompt chunk computes KV but does not sample
                logits = logits[torch.from_numpy(np.flatnonzero(samples)).to(self.device)]
            self._parked = _ParkedLogits(req_ids, sampling_req_ids, num_draft_sampling, drafts, logits)
            return None
        attn_inputs = AttentionInputs(
            slot_mapping=torch.from_numpy(step.slot_mapping).to(self.device),
            query_start_loc=step.query_start_loc,
            num_computed_tokens=num_computed,
            seq_lens=step.seq_lens,
            block_table=torch.from_numpy(batch.block_table[rows]).to(self.device),
            block_size=self.block_size,
        )
        metadata = self.attn_backend.build_metadata(attn_inputs)
        logits = self.model(
            torch.from_numpy(step.input_ids.astype(np.int64)).to(self.device),
            torch.from_numpy(step.positions).to(self.device),
            self.kv_caches, self.attn_backend, metadata,
            torch.from_numpy(logits_indices).to(self.device),
        )
        self._parked = _ParkedLogits(req_ids, sampling_req_ids, num_draft_sampling, drafts, logits)
        return None

    @torch.inference_mode()
    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        parked, self._parked = self._parked, None
        if parked is None:
            raise RuntimeError("sample_tokens called without a preceding execute_model")
        if grammar_output is not None and grammar_output.deferred:  # their rows are not ready: no sample
            parked = _without(parked, grammar_output.deferred)
        if not parked.sampling_req_ids:
            return ModelRunnerOutput(parked.req_ids, {})
        # one logits row per position: each request's next token, then one after each draft token
        num_rows = [1 + n for n in parked.num_draft_tokens]
        row_req_ids = [r for r, n in zip(parked.sampling_req_ids, num_rows) for _ in range(n)]
        bitmask = bitmask_rows = None
        if grammar_output is not None:
            first = grammar_output.structured_output_request_ids
            bitmask_rows = np.fromiter(
                (first[r] + i if r in first else -1 for r, n in zip(parked.sampling_req_ids, num_rows)
                 for i in range(n)), dtype=np.int64, count=len(row_req_ids))
            bitmask = grammar_output.grammar_bitmask
        meta = self._sampling_metadata(row_req_ids)
        out = self.sampler(parked.logits, meta, bitmask, bitmask_rows)
        dead_end_rows = set(out.dead_end_rows.tolist())
        chosen = out.token_ids.tolist()
        dead_ends: set[str] = set()
        sampled: dict[str, list[int]] = {}
        logprobs = {}
        batch = self.input_batch
        start = 0
        for req_id, n in zip(parked.sampling_req_ids, num_rows):
            draft = parked.drafts.get(req_id)
            num_kept = num_accepted(draft, chosen[start:start + n]) if draft else 0
            last = start + num_kept  # the row of the token after the accepted draft tokens
            if last in dead_end_rows:
                dead_ends.add(req_id)
            else:
                token_ids = chosen[start:last + 1]
                batch.append_token_ids(batch.requests[req_id].row, token_ids)  # over the draft
                sampled[req_id] = token_ids
                if out.logprobs[start] is not None:
                    logprobs[req_id] = out.logprobs[start:last + 1]
            start += n
        return ModelRunnerOutput(parked.req_ids, sampled, logprobs, dead_ends)

    def _write_drafts(self, drafts: dict[str, list[int]], req_ids: list[str], rows: np.ndarray) -> np.ndarray:
        """Put each draft after its request's tokens in the token cache, where the step's inputs are
        read (the request's token count is not moved: verification decides what stays); returns
        the number of draft tokens per scheduled request."""
        num_draft = np.zeros(len(req_ids), dtype=np.int32)
        if not drafts:
            return num_draft
        batch = self.input_batch
        for i, req_id in enumerate(req_ids):
            draft = drafts.get(req_id)
            if draft:
                start = batch.num_tokens[rows[i]]
                batch.token_ids[rows[i], start:start + len(draft)] = draft
                num_draft[i] = len(draft)
        return num_draft

    # ---- bookkeeping -----------------------------------------------------------------

    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in so.preempted_req_ids:
            batch.remove_request(req_id, preempted=True)
        for req_id in so.finished_req_ids:
            batch.remove_request(req_id)
        for new in so.scheduled_new_reqs:
            batch.remove_request(new.req_id, preempted=True)  # resumed after preemption: rebuilt from scratch
            batch.add_request(new.req_id, new.token_ids, new.num_prompt_tokens, new.sampling_params,
                              new.block_ids, new.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        for req_id, new_token_ids, new_block_ids, num_computed in zip(
                cached.req_ids, cached.new_token_ids, cached.new_block_ids, cached.num_computed_tokens):
            row = batch.requests[req_id].row
            if new_token_ids:  # jump-forward text the scheduler appended
                batch.append_token_ids(row, new_token_ids)
            if new_block_ids:
                batch.append_block_ids(row, new_block_ids)
            batch.num_computed_tokens[row] = num_computed

    def _sampling_metadata(self, req_ids: list[str]) -> SamplingMetadata:
        batch = self.input_batch
        states = [batch.requests[r] for r in req_ids]
        params = [s.sampling_params for s in states]
        penalties = {}
        for i, (state, p) in enumerate(zip(states, params)):
            if p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
                penalties[i] = (batch.all_token_ids(state.req_id), batch.output_token_ids(state.req_id),
                                p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        return SamplingMetadata(
            banned_token_ids=self._banned_token_ids(req_ids, states),
            temperature=np.array([p.temperature for p in params], dtype=np.float32),
            top_k=np.array([p.top_k for p in params], dtype=np.int64),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            min_p=np.array([p.min_p for p in params], dtype=np.float32),
            generators=[s.generator for s in states],
            penalties=penalties,
            num_logprobs=[p.logprobs for p in params],
        )

    def _banned_token_ids(self, req_ids: list[str], states: list[CachedRequestState]) -> dict[int, np.ndarray]:
        """Rows whose request is short of its min_tokens -> the ids that would end it. A request's
        rows after its first verify its draft tokens, one output position further each."""
        banned: dict[int, np.ndarray] = {}
        previous, offset = None, 0
        for row, (req_id, state) in enumerate(zip(req_ids, states)):
            params = state.sampling_params
            offset = offset + 1 if req_id == previous else 0
            previous = req_id
            if not params.min_tokens:
                continue
            num_output_tokens = int(self.input_batch.num_tokens[state.row]) - state.num_prompt_tokens + offset
            if num_output_tokens < params.min_tokens:
                ids = list(params.stop_token_ids) + ([] if params.ignore_eos else self.eos_token_ids.tolist())
                if ids:
                    banned[row] = np.unique(np.array(ids, dtype=np.int64))
        return banned


def _torch_dtype(name: str | None) -> torch.dtype | None:
    return getattr(torch, name) if name else None
