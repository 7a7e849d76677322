"""Messages between the front end (service/ or the offline LLM) and the engine core.

msgspec structs, array_like and omit_defaults: msgpack-encoded, they are compact and cheap to
build, which matters because one crosses the process boundary every engine step.
"""
from __future__ import annotations

import enum

import msgspec

from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint


class FinishReason(enum.IntEnum):
    """Why a request ended, as clients see it."""

    STOP = 0  # EOS, a stop string / token id, or the grammar completed
    LENGTH = 1  # max_tokens or the context length
    ABORT = 2  # cancelled by the client or a deadline
    ERROR = 3  # grammar compile failure or a grammar dead end


class ErrorKind(enum.IntEnum):
    """What ended a request with FinishReason.ERROR, which decides how the front end answers it."""

    INVALID_REQUEST = 0  # refused before it ran: the request itself is wrong (the message says how)
    OVERLOADED = 1  # refused before it ran: the engine was short of memory; retry later
    MEMORY_SUSPECT = 2  # failed while its grammar compiled, the engine short of memory: the compile may be why
    CONSTRAINT = 3  # its constraint caused it (a grammar limit, or its grammar work failed): even after tokens
    INTERNAL = 4  # the engine failed it mid-generation (a grammar dead end)


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0  # time.monotonic() at the front end; 0: set by the core
    priority: int = 0  # lower is served first


class AbortRequests(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    request_ids: list[str]


class ValidateConstraint(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    call_id: int
    constraint: Constraint


class GetStats(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    call_id: int


class Shutdown(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


# everything the front end sends to the core
EngineCoreInput = EngineCoreRequest | AbortRequests | ValidateConstraint | GetStats | Shutdown


class TokenLogprob(msgspec.Struct, array_like=True, omit_defaults=True):
    token_id: int
    logprob: float
    # top-n alternatives at this position: (token_id, logprob), most likely first
    top: list[tuple[int, float]] = []


class RequestCounters(msgspec.Struct, array_like=True, omit_defaults=True):
    """What a request cost and got, counted by the core and handed on whole to the client."""

    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_forward_passes: int = 0  # forward passes this request took part in
    num_forced_tokens: int = 0  # output tokens appended by jump-forward (or closing early), not sampled
    # draft tokens verified (speculative decoding), and of those, the ones the model agreed with
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    queued_s: float = 0.0  # arrival -> first scheduled
    grammar_wait_s: float = 0.0  # arrival -> grammar compiled (0 without a constraint)


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """What one request produced in one step (only requests with news are reported)."""

    request_id: str
    new_token_ids: list[int] = []
    new_logprobs: list[TokenLogprob] = []
    finish_reason: int | None = None  # a FinishReason; None while running
    stop_reason: int | str | None = None  # the stop token id that ended it, if any
    error: str | None = None  # set with FinishReason.ERROR: a message the client can act on
    error_kind: ErrorKind | None = None  # set with FinishReason.ERROR
    # the counters as of this output: on the first output (the prompt's), on the final one, and on
    # every output of a request that drafted (the front end may end it on a stop string, and then it
    # never sees the final output); None on the others
    counters: RequestCounters | None = None
    # set on the final output only
    not_enforced: list[str] = []  # best-effort constraint: parts of the schema not enforced
    grammar_cache_hit: bool = False  # the compiled grammar came from the compile cache
    grammar_backend: str = ""  # the grammar library that enforced the constraint ("" without one)
    # with STOP: the engine, not the model, completed the output: "budget" (max_tokens or the
    # context was about to run out), "repetition", "digits" or "depth" (a runaway loop); "" if not
    closed_early: str = ""


class EngineStats(msgspec.Struct, array_like=True, omit_defaults=True):
    num_running: int = 0
    num_waiting: int = 0
    num_waiting_for_grammar: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_cached_blocks: int = 0
    num_steps: int = 0
    num_grammar_cache_hits: int = 0  # constraints served by the compile cache since the engine started
    num_grammar_compiles: int = 0  # compile-cache misses: grammars compiled since the engine started


class StepStats(msgspec.Struct, array_like=True, omit_defaults=True):
    """What the engine measured since its last report, for the front end's metrics.

    The lists hold one entry per engine step that ran a forward pass, in order (columns rather than
    one struct per step: a step appends a few numbers, nothing per token). The counters are totals
    since the engine started: the front end adds their growth, and a smaller total means a new engine.
    """

    num_reqs: list[int] = []  # requests in the step's batch
    num_tokens: list[int] = []  # tokens computed in the step
    num_bitmask_rows: list[int] = []  # constrained requests whose bitmask row was filled
    forward_s: list[float] = []  # execute_model in the worker thread
    fill_s: list[float] = []  # grammar bitmask fill on the engine thread, beside the forward
    wait_s: list[float] = []  # engine thread blocked on the forward after the fill
    sample_s: list[float] = []  # bitmask application + sampling
    total_s: list[float] = []  # launch -> outputs built
    compile_s: list[float] = []  # grammar compiles that finished (successful or not), seconds each
    # the grammar library of each compile in compile_s (the one asked for, "auto" included, when it failed)
    compile_backends: list[str] = []
    num_steps: int = 0
    num_preemptions: int = 0
    num_compile_cache_hits: int = 0
    num_compile_cache_misses: int = 0
    num_compile_cache_evictions: int = 0
    # backend (as asked for) -> failure reason ("timeout", "limit", "invalid", "out_of_memory",
    # "internal") -> compiles that failed
    compile_failures: dict[str, dict[str, int]] = {}


class ConstraintReport(msgspec.Struct, array_like=True, omit_defaults=True):
    ok: bool
    error: str = ""
    compile_s: float = 0.0
    cached: bool = False
    not_enforced: list[str] = []
    backend: str = ""  # the grammar library that compiled it ("xgrammar", "llguidance")


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """One step's news, or the answer to a call (stats / validate), from the core."""

    outputs: list[EngineCoreOutput] = []
    call_id: int = 0  # set when answering GetStats / ValidateConstraint
    stats: EngineStats | None = None
    report: ConstraintReport | None = None
    step_stats: StepStats | None = None  # since the last report; None when the engine collects none


class EngineCoreReady(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """The core's first message: the model is loaded and inputs are welcome."""

    model_name: str
    model_dir: str  # the front end loads the same tokenizer from here
    max_model_len: int  # tokens, prompt + output
    vocab_size: int
    eos_token_id: int | None = None
    block_size: int = 16  # tokens per KV block
    num_total_blocks: int = 0  # KV blocks a request can use
    max_num_seqs: int = 0  # requests in one step
    max_num_waiting: int = 0  # the engine's own queue length
    pid: int = 0  # the engine process (0: in-process)


class EngineCoreDead(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """The core's last message when it fails to start or a step raises."""

    error: str


# everything the core sends to the front end
EngineCoreMessage = EngineCoreOutputs | EngineCoreReady | EngineCoreDead
