"""The Responses API's answer: a `response` object, whole or as the stream of events the openai SDK
accumulates (`client.responses.stream`).

The output is a list of items: a `reasoning` item (a model with think markers: the think section),
a `message` item with one `output_text` part (the answer's text), and a `function_call` item per
tool call. A stream opens each item (`response.output_item.added`), sends its text or arguments as
deltas, closes it (`...done`, then `response.output_item.done` with the whole item), and ends with
`response.completed` (or `response.incomplete` when max_output_tokens ran out) carrying the whole
response with the same item ids.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.protocol import FinishReason
from service import assistant_output
from service.assistant_output import AssistantStream, OutputShape
from service.http.responses import formwork_extension, usage
from service.http.streaming import encode_json

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from service.http.response_request import ResponsesRequest

CountTokens = Callable[[str], int]


@dataclass(frozen=True)
class ResponseHeader:
    """What every form of one response repeats: its id, the request's settings echoed back."""

    response_id: str
    created_at: int
    model: str
    request: ResponsesRequest
    shape: OutputShape
    count_tokens: CountTokens  # tokens of a text: the reasoning tokens in usage

    def body(self, status: str, output: list[dict[str, Any]], final: RequestOutput | None = None,
             reasoning_text: str = "") -> dict[str, Any]:
        request = self.request
        text_format = ({"type": "text"} if request.text is None or request.text.format is None
                       else request.text.format.model_dump(by_alias=True, exclude_none=True))
        tool_choice: Any = request.tool_choice or "auto"
        if not isinstance(tool_choice, str):
            tool_choice = tool_choice.model_dump()
        body: dict[str, Any] = {
            "id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
            "error": None, "incomplete_details": None, "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": request.parallel_tool_calls is not False, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False,  # nothing is stored
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "text": {"format": text_format}, "tool_choice": tool_choice,
            "tools": [t.model_dump(exclude_none=True) for t in request.tools or []],
            "top_p": 1.0 if request.top_p is None else request.top_p, "truncation": "disabled",
            "metadata": (request.model_extra or {}).get("metadata") or {}, "usage": None,
        }
        if final is not None:
            if final.finish_reason == FinishReason.LENGTH:
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            reasoning_tokens = (self.count_tokens(reasoning_text + self.shape.reasoning.end)
                                if reasoning_text and self.shape.reasoning is not None else 0)
            counts = usage([final], 1)  # chat's, renamed as the Responses API names them
            body["usage"] = {"input_tokens": counts["prompt_tokens"],
                             "input_tokens_details": counts["prompt_tokens_details"],
                             "output_tokens": counts["completion_tokens"],
                             "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens,
                                                                               counts["completion_tokens"])},
                             "total_tokens": counts["total_tokens"]}
            body["formwork"] = formwork_extension([final])
        return body


def status_of(final: RequestOutput) -> str:
    return {FinishReason.LENGTH: "incomplete", FinishReason.ABORT: "cancelled"}.get(final.finish_reason, "completed")


def whole_response(header: ResponseHeader, final: RequestOutput) -> dict[str, Any]:
    """The non-streamed answer."""
    parts = assistant_output.split(final.text, header.shape)
    output = []
    if parts.reasoning:
        output.append(_reasoning_item(_item_id("rs"), parts.reasoning))
    if parts.content or not parts.calls:
        output.append(_message_item(_item_id("msg"), parts.content))
    output += [_call_item(_item_id("fc"), call.id, call.name, call.arguments) for call in parts.calls]
    return header.body(status_of(final), output, final, parts.reasoning)


class ResponseEvents:
    """One streamed response: `start()`, then `step(output)` for each engine output (the last one
    finished); each returns the server-sent events to write."""

    def __init__(self, header: ResponseHeader) -> None:
        self.header = header
        self._reader = AssistantStream(header.shape)
        self._num_events = 0
        self._items: list[dict[str, Any]] = []  # output items, as far as they are written
        self._open_text: int | None = None  # output index of the open message or reasoning item
        self._open_calls: dict[int, int] = {}  # call index (AssistantStream's) -> output index
        self._reasoning = ""

    def start(self) -> bytes:
        response = self.header.body("in_progress", [])
        return (self._event("response.created", response=response)
                + self._event("response.in_progress", response=response))

    def step(self, output: RequestOutput) -> bytes:
        parts = self._reader.step(output.text, output.finished)
        events = b""
        if parts.reasoning:
            events += self._text_delta("reasoning", parts.reasoning)
            self._reasoning += parts.reasoning
        if parts.content:
            events += self._text_delta("message", parts.content)
        for call in parts.call_deltas:
            events += self._close_text()
            if call.id:
                index = len(self._items)
                self._items.append(_call_item(_item_id("fc"), call.id, call.name, "", "in_progress"))
                self._open_calls[call.index] = index
                events += self._event("response.output_item.added", output_index=index, item=self._items[index])
            else:
                index = self._open_calls[call.index]
                self._items[index]["arguments"] += call.arguments
                events += self._event("response.function_call_arguments.delta", item_id=self._items[index]["id"],
                                      output_index=index, delta=call.arguments)
        if output.finished:
            events += self._finish(output)
        return events

    def error(self, body: dict[str, Any]) -> bytes:
        """The error event for an error after the first event (the engine died)."""
        error = body["error"]
        return self._event("error", code=error.get("code"), message=error["message"], param=error.get("param"))

    # ---- items --------------------------------------------------------------------------------

    def _text_delta(self, kind: str, delta: str) -> bytes:
        """`delta` added to the open item of `kind` (message or reasoning), opened here if needed."""
        events = b""
        index = self._open_text
        if index is None or self._items[index]["type"] != kind:
            events += self._close_text()
            index = self._open_text = len(self._items)
            if kind == "message":
                self._items.append(_message_item(_item_id("msg"), "", "in_progress"))
                events += self._event("response.output_item.added", output_index=index,
                                      item={**self._items[index], "content": []})
                events += self._event("response.content_part.added", item_id=self._items[index]["id"],
                                      output_index=index, content_index=0, part=_text_part(""))
            else:
                self._items.append(_reasoning_item(_item_id("rs"), ""))
                events += self._event("response.output_item.added", output_index=index,
                                      item={**self._items[index], "content": []})
        item = self._items[index]
        item["content"][0]["text"] += delta
        event_type = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        return events + self._event(event_type, item_id=item["id"], output_index=index, content_index=0, delta=delta,
                                    **extra)

    def _close_text(self) -> bytes:
        index, self._open_text = self._open_text, None
        if index is None:
            return b""
        item = self._items[index]
        text = item["content"][0]["text"]
        if item["type"] == "message":
            item["status"] = "completed"
            events = self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                 content_index=0, text=text, logprobs=[])
            events += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=item["content"][0])
        else:
            events = self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                 content_index=0, text=text)
        return events + self._event("response.output_item.done", output_index=index, item=item)

    def _finish(self, final: RequestOutput) -> bytes:
        events = self._close_text()
        if not self._items:  # an empty answer is still a message, as the whole response has it
            events += self._text_delta("message", "") + self._close_text()
        for index in self._open_calls.values():
            item = self._items[index]
            item["status"] = "completed"
            events += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  name=item["name"], arguments=item["arguments"])
            events += self._event("response.output_item.done", output_index=index, item=item)
        self._open_calls = {}
        status = status_of(final)
        response = self.header.body(status, self._items, final, self._reasoning)
        return events + self._event("response.incomplete" if status == "incomplete" else "response.completed",
                                    response=response)

    def _event(self, event_type: str, **fields: Any) -> bytes:
        data = {"type": event_type, "sequence_number": self._num_events, **fields}
        self._num_events += 1
        return b"event: " + event_type.encode() + b"\ndata: " + encode_json(data) + b"\n\n"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [_text_part(text)]}


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
