"""One streamed `/v1/chat/completions` answer read as OpenAI's server-sent events carry it: the
content, the tool calls pieced together from their deltas (a call's first delta names it, the next
ones carry pieces of its arguments), the finish reason, the usage, and when each chunk that carried
text or a piece of a call arrived.

Plain Python: the peer scripts import it from their own folder (their interpreters have no
Formwork); the load generator's HTTP client imports it as bench.peers.chat_stream.
"""
from __future__ import annotations

import json


class ChatStream:
    """Feed it the response's lines in order, each with the seconds since the request was sent."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.final_chunk: dict | None = None  # the chunk with the usage (a server may add its own fields)
        self.error: str | None = None  # an error the server sent inside the stream
        self.token_times_s: list[float] = []  # arrival of each chunk with text or a piece of a call
        self._content: list[str] = []
        self._calls: dict[int, tuple[list[str], list[str]]] = {}  # index -> (name, argument pieces)

    def feed(self, line: str, elapsed_s: float) -> bool:
        """Read one line; False once the stream has ended ([DONE] or an error)."""
        if not line.startswith("data: "):
            return True
        if line == "data: [DONE]":
            return False
        chunk = json.loads(line[6:])
        if "error" in chunk:
            error = chunk["error"]
            self.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            return False
        if chunk.get("usage"):
            self.final_chunk = chunk
        carried = False
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self._content.append(delta["content"])
                carried = True
            for call in delta.get("tool_calls") or []:
                name, arguments = self._calls.setdefault(call.get("index", 0), ([], []))
                function = call.get("function") or {}
                if function.get("name"):
                    name.append(function["name"])
                    carried = True
                if function.get("arguments"):
                    arguments.append(function["arguments"])
                    carried = True
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if carried:
            self.token_times_s.append(elapsed_s)
        return True

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def tool_calls(self) -> list[tuple[str, str]]:
        """(name, arguments text) of each call, in index order."""
        return [("".join(name), "".join(arguments)) for _, (name, arguments) in sorted(self._calls.items())]
