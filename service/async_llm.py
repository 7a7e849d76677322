"""The service's engine: requests in, RequestOutputs out, over an EngineCoreClient. No wire format
here: both front ends call it with service/request.py's structs.

Checks requests and resolves them against the chat format (`prepare`), renders chat templates
and tokenizes, admits requests (queue length, context length, KV capacity), detokenizes through
the shared OutputProcessor, and aborts a request in the core whenever its consumer stops early (client cancellation, deadline, error): in every state
(queued, waiting for its grammar, running) the core drops it and frees its KV blocks.
Every refusal is a ServiceError with its kind and a message naming the numbers. A request
whose constraint is quarantined (service/quarantine.py) is refused with UNAVAILABLE.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.capacity import KVCacheTooSmall, PromptTooLong, check_context_length, check_kv_capacity
from engine.frontend.core_client import EngineDeadError
from engine.frontend.output_processor import OutputProcessor, RequestOutput
from engine.frontend.tokenizer import Tokenizer
from engine.frontend.tool_prompt import render_inputs
from engine.protocol import (ConstraintReport, EngineCoreOutput, EngineCoreRequest, EngineStats, ErrorKind,
                             FinishReason)
from engine.sampling_params import SamplingParams
from grammar.chat.tool_calls import SYNTAXES
from grammar.constraint import Constraint
from service.chat_format import ChatFormat
from service.errors import ErrorCode, FieldViolation, ServiceError, invalid_argument, overloaded, unavailable
from service.observability.telemetry import Telemetry
from service.quarantine import Quarantine
from service.validation import check_prompt, sampling_params

if TYPE_CHECKING:
    from engine.frontend.core_client import EngineCoreClient, RequestOutputStream
    from engine.protocol import EngineCoreReady
    from service.assistant_output import OutputShape
    from service.limits import ServiceLimits
    from service.request import GenerationRequest, PromptInput

logger = logging.getLogger(__name__)

_OFF_LOOP_CHARS = 32 * 1024  # tokenize prompts longer than this on a worker thread
WARM_UP_REQUEST_ID = "warm-up"


@dataclass(frozen=True)
class EncodedPrompt:
    token_ids: list[int]
    field: str  # the request field it came from (errors about its length name it)


@dataclass(frozen=True)
class PreparedRequest:
    """A GenerationRequest checked, planned against the chat format and tokenized: what generate() takes."""

    params: SamplingParams
    prompts: list[EncodedPrompt]
    shape: OutputShape  # how the output is read back (think section, tool calls)


class AsyncLLM:
    """Not thread-safe: use it from the one event loop that started it."""

    def __init__(self, client: EngineCoreClient, limits: ServiceLimits, quarantine: Quarantine | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.client = client
        self.limits = limits
        self.quarantine = quarantine or Quarantine(0)  # 0 s: nothing is ever quarantined
        # every request that ends is reported here once (metrics, its log line, its spans)
        self.telemetry = telemetry or Telemetry()
        client.on_step_stats = self.telemetry.engine_steps
        self.info: EngineCoreReady | None = None  # set by start()
        # after the core died: what is being done about it (set by the supervisor)
        self.down_reason: str | None = None
        self.tokenizer: Tokenizer | None = None
        self.output_processor: OutputProcessor | None = None
        self.chat_format = ChatFormat()  # the model's, once started
        # request id -> its core output stream, from admission until the request ends here
        self._streams: dict[str, RequestOutputStream] = {}
        self._closing = False
        # token id -> its text, for logprobs
        self.token_text = functools.lru_cache(maxsize=1 << 16)(self._token_text)

    async def start(self) -> EngineCoreReady:
        """Start the core (loads the model) and the tokenizer; EngineDeadError if the core fails."""
        info = await self.client.start()
        self.tokenizer = await asyncio.to_thread(Tokenizer.from_model_dir, info.model_dir)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.chat_format = ChatFormat.for_model(info.model_dir, self.tokenizer.chat_template, self.limits)
        self.info = info
        return info

    async def warm_up(self) -> None:
        """Send one short constrained request through the whole path (template, tokenizer, grammar
        compile and bitmask, forward, sampler, detokenizer), so the first client does not pay for it."""
        assert self.tokenizer is not None
        prompt = self.tokenizer.encode_chat([{"role": "user", "content": "Say hello in JSON."}])
        params = SamplingParams(max_tokens=4, temperature=0.0, constraint=Constraint(kind="json_object"))
        final = None
        async for final in self.generate(prompt, params, request_id=WARM_UP_REQUEST_ID, stream=False):
            pass
        if final is None or final.finish_reason == FinishReason.ERROR:
            raise RuntimeError(f"the warm-up request failed: {final.error if final else 'no output'}")

    async def restart(self) -> EngineCoreReady:
        """Start a new core after the old one died (same model, so the same tokenizer; warm it up
        next); EngineDeadError if it cannot start."""
        self.telemetry.engine_restarted()  # the new core counts from zero
        self.info = await self.client.restart()
        return self.info

    def crash_suspects(self, error: EngineDeadError) -> list[Constraint]:
        """The constraints in flight when the core died (the warm-up's is the server's own)."""
        return [c for request_id, c in error.in_flight.items() if c is not None and request_id != WARM_UP_REQUEST_ID]

    # ---- state --------------------------------------------------------------------------------

    def check_available(self) -> None:
        """UNAVAILABLE while loading, after the core died (while it restarts), and while shutting down."""
        if self.info is None:
            raise unavailable("the model is still loading; retry once health reports SERVING")
        dead = self.client.dead_error
        if dead is not None:
            note = f"; {self.down_reason}" if self.down_reason else ""
            raise unavailable(f"the engine is unavailable: {dead}{note}")
        if not self.client.is_alive:  # a new core is loading
            raise unavailable("the engine is restarting after it died; retry once health reports SERVING")
        if self._closing:
            raise unavailable("the server is shutting down")

    def check_quarantine(self, constraint: Constraint | None, field: str | None) -> None:
        """UNAVAILABLE, for a while, for a constraint in flight at two engine failures."""
        if constraint is None:
            return
        remaining_s = self.quarantine.remaining_s(constraint)
        if remaining_s is not None:
            raise unavailable(
                f"{field or 'constraint'}: quarantined for another {remaining_s:.0f} s: the engine died (or ran "
                f"short of memory) {self.quarantine.strikes} times with this constraint in flight")

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def closing(self) -> bool:
        return self._closing

    def stop_accepting(self) -> None:
        self._closing = True

    def abort_all(self) -> int:
        """End every in-flight request now: each ends with FinishReason.ABORT and its text so far."""
        for request_id, stream in list(self._streams.items()):
            self.client.abort_requests([request_id])
            stream.put(EngineCoreOutput(request_id, finish_reason=int(FinishReason.ABORT)))
        return len(self._streams)

    # ---- requests -----------------------------------------------------------------------------

    async def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Check `request` (its prompts, sampling and constraint), resolve its tools and reasoning
        against the model's chat format, and tokenize its prompts. Raises ServiceError naming the field."""
        self.check_available()
        info = self.info
        assert info is not None
        prompts = [check_prompt(p, info.vocab_size) for p in request.prompts]
        params = sampling_params(request, self.limits, info.vocab_size)
        plan = self.chat_format.plan(request.chat, params.constraint, self.limits)
        encoded = [EncodedPrompt((await self.encode_prompt(plan.prompt(p)))[0], p.field) for p in prompts]
        return PreparedRequest(plan.sampling(params), encoded, plan.shape)

    async def encode_prompt(self, prompt: PromptInput) -> tuple[list[int], str | None]:
        """The prompt's token ids, and for a chat the text the template rendered."""
        self.check_available()
        tokenizer = self.tokenizer
        assert tokenizer is not None
        if prompt.token_ids is not None:
            return prompt.token_ids, None
        if prompt.messages is not None:
            messages, tool_kwargs = render_inputs(prompt.messages, prompt.tools, tokenizer.chat_template,
                                                  SYNTAXES[self.chat_format.tool_syntax])
            template_kwargs = {**(prompt.template_kwargs or {}), **tool_kwargs}
            try:
                text = tokenizer.apply_chat_template(messages, prompt.add_generation_prompt, **template_kwargs)
            except ValueError as e:
                raise invalid_argument("chat.messages", str(e)) from None
            return await self._encode(text, add_special_tokens=False), text  # the template wrote them
        assert prompt.text is not None
        return await self._encode(prompt.text, add_special_tokens=True), None

    async def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        assert self.tokenizer is not None
        if len(text) > _OFF_LOOP_CHARS:
            return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str,
                       priority: int = 0, arrival_time: float | None = None, stream: bool = True,
                       prompt_field: str = "prompt", constraint_field: str | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Run one request. Yields an output per step with new tokens (`stream`) or only the final
        one; the last output has `finished` set.

        Raises ServiceError before anything is queued if the request is refused (UNAVAILABLE for a
        quarantined constraint), RESOURCE_EXHAUSTED if the core refuses it for want of memory, and
        UNAVAILABLE if the core dies. Closing the generator early (use contextlib.aclosing) aborts
        the request in the core. An output with FinishReason.ERROR is yielded, not raised: the
        caller decides.
        """
        self.check_available()
        self.check_quarantine(params.constraint, constraint_field)
        self._admit(len(prompt_token_ids), params.max_tokens, prompt_field)
        assert self.output_processor is not None
        arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.output_processor.add_request(request_id, prompt_token_ids, params, arrival_time, stream)
        try:
            outputs = self.client.add_request(
                EngineCoreRequest(request_id, prompt_token_ids, params, arrival_time=arrival_time, priority=priority))
        except (EngineDeadError, ValueError) as e:
            self.output_processor.abort(request_id)
            if isinstance(e, ValueError):
                raise invalid_argument("request_id", str(e)) from None
            raise unavailable(f"the engine is unavailable: {e}") from None
        self._streams[request_id] = outputs
        finished = False
        try:
            while not finished:
                core_output = await outputs.get()
                if core_output.error_kind == ErrorKind.OVERLOADED:  # the core refused it for want of memory
                    raise overloaded(core_output.error or "the engine is overloaded; retry later")
                if core_output.error_kind == ErrorKind.MEMORY_SUSPECT and params.constraint is not None:
                    if self.quarantine.record_strike([params.constraint]):
                        logger.warning("quarantined for %.0f s: a %s constraint the engine ran short of memory "
                                       "compiling %d times", self.quarantine.duration_s, params.constraint.kind,
                                       self.quarantine.strikes)
                request_outputs, to_abort = self.output_processor.process_outputs([core_output])
                if to_abort:  # a stop string ended it here: free it in the core
                    self.client.abort_requests(to_abort)
                for output in request_outputs:
                    finished = output.finished
                    if finished and request_id != WARM_UP_REQUEST_ID:
                        self.telemetry.request_finished(output, params.constraint, arrival_time)
                    yield output
        except EngineDeadError as e:
            raise unavailable(f"the engine is unavailable: {e}") from None
        finally:
            del self._streams[request_id]
            if not finished:  # cancelled, deadline, or the consumer stopped: free it in the core
                self.client.abort_requests([request_id])
                aborted = self.output_processor.abort(request_id)
                if aborted is not None and request_id != WARM_UP_REQUEST_ID:
                    self.telemetry.request_finished(aborted, params.constraint, arrival_time)

    def _admit(self, num_prompt_tokens: int, max_tokens: int, prompt_field: str) -> None:
        info = self.info
        assert info is not None
        try:
            check_context_length(num_prompt_tokens, info.max_model_len)
        except PromptTooLong as e:
            raise ServiceError(ErrorCode.INVALID_ARGUMENT, f"{prompt_field}: {e}",
                               [FieldViolation(prompt_field, str(e))]) from None
        try:
            check_kv_capacity(num_prompt_tokens, max_tokens, info.max_model_len, info.num_total_blocks,
                              info.block_size)
        except KVCacheTooSmall as e:
            raise ServiceError(ErrorCode.RESOURCE_EXHAUSTED, str(e)) from None
        capacity = info.max_num_seqs + info.max_num_waiting
        if len(self._streams) >= capacity:
            raise overloaded((
                f"the queue is full: {len(self._streams)} requests in flight ({info.max_num_seqs} running + "
                f"{info.max_num_waiting} waiting at most); retry later"))

    # ---- calls --------------------------------------------------------------------------------

    async def validate_constraint(self, constraint: Constraint, field: str | None = None) -> ConstraintReport:
        self.check_available()
        self.check_quarantine(constraint, field)
        try:
            return await self.client.validate_constraint(constraint)
        except EngineDeadError as e:
            raise unavailable(f"the engine is unavailable: {e}") from None

    async def get_stats(self) -> EngineStats:
        self.check_available()
        try:
            return await self.client.get_stats()
        except EngineDeadError as e:
            raise unavailable(f"the engine is unavailable: {e}") from None

    def _token_text(self, token_id: int) -> str:
        assert self.tokenizer is not None
        return self.tokenizer.decode([token_id])

    async def shutdown(self) -> None:
        self._closing = True
        await self.client.shutdown()
