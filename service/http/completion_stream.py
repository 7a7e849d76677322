"""A chat or text completion streamed as server-sent events, in OpenAI's chunk shapes."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.protocol import FinishReason
from service.assistant_output import AssistantStream, OutputShape
from service.errors import ServiceError, error_from_output
from service.http import responses
from service.http.conversion import Translated
from service.http.errors import http_error
from service.http.streaming import DONE_EVENT, event

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput


@dataclass(frozen=True)
class CompletionCall:
    """One generation call: what it asks for, and how to answer."""

    translated: Translated
    chat: bool
    logprobs: bool
    model: str
    response_id: str
    created: int
    shape: OutputShape = OutputShape()  # how each choice's output is read back
    num_prompt_tokens: int = 0  # of all prompts, each once


async def completion_events(call: CompletionCall, first: tuple[int, RequestOutput],
                            outputs: AsyncIterator[tuple[int, RequestOutput]], num_choices: int,
                            token_text: Callable[[int], str]) -> AsyncIterator[bytes]:
    """The call's server-sent events: the chunks of every choice as they come, an error event
    (then [DONE]) where a choice fails or the engine dies, the usage chunk if asked for."""
    translated = call.translated
    include_usage = translated.include_usage
    finals: list[RequestOutput | None] = [None] * num_choices
    readers = [AssistantStream(call.shape) for _ in range(num_choices)]
    num_output_tokens = [0] * num_choices  # per choice, so far: continuous usage

    def chunk(index: int, output: RequestOutput | None, opening: bool = False) -> bytes:
        usage_so_far = None
        if translated.continuous_usage:
            if output is not None:
                num_output_tokens[index] = output.num_output_tokens
            usage_so_far = responses.running_usage(call.num_prompt_tokens, sum(num_output_tokens))
        if call.chat:
            return b"".join(event(c) for c in responses.chat_chunks(
                call.response_id, call.created, call.model, index, output, token_text, call.logprobs,
                include_usage, opening, None if call.shape.plain else readers[index], usage_so_far))
        assert output is not None
        return event(responses.completion_chunk(call.response_id, call.created, call.model, index, output,
                                                token_text, call.logprobs, include_usage, usage_so_far))

    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        if call.chat:
            yield b"".join(chunk(index, None, opening=True) for index in range(num_choices))
        pending = [first]
        while True:
            for index, output in pending:
                if output.finish_reason == FinishReason.ERROR:
                    error = error_from_output(output, translated.request.constraint_field)
                    renamed, param = translated.field_names.rename(error)
                    yield event(http_error(renamed, param).body())
                    yield DONE_EVENT
                    return
                if output.finished:
                    finals[index] = output
                yield chunk(index, output)
            try:
                pending = [await anext(outputs)]
            except StopAsyncIteration:
                break
            except ServiceError as e:  # the engine died mid-stream
                yield event(http_error(e).body())
                yield DONE_EVENT
                return
    if include_usage:
        obj = "chat.completion.chunk" if call.chat else "text_completion"
        yield event(responses.usage_chunk(call.response_id, call.created, call.model, obj,
                                          [f for f in finals if f is not None], translated.num_choices))
    yield DONE_EVENT
