"""Reading a call syntax's calls back out of the model's text: what the syntaxes (JSON calls,
XML parameters, the pythonic list) share. Library-free."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

# (text, where a call begins) -> (where the call ends, [(tool name, arguments as JSON text)]), or
# None where the call is not complete or does not read
CallAt = Callable[[str, int], tuple[int, list[tuple[str, str]]] | None]


class CallReader(ABC):
    """A call syntax's reading side: `parse` is `scan` with the text around the calls stripped."""

    @abstractmethod
    def scan(self, text: str) -> tuple[str, list[tuple[str, str]], int | None]:
        """(the text outside the calls, unstripped; the calls; where a call begins that is not
        complete or does not read, or None)."""

    def parse(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """(the text outside the calls, [(tool name, arguments as JSON text)]).

        A call that is not complete or does not read stays in the text, so nothing the model
        wrote is lost; under a required/named constraint every call is complete and reads.
        """
        content, calls, _ = self.scan(text)
        return content.strip(), calls


def scan_calls(text: str, trigger: str, call_at: CallAt, separator_chars: str) -> tuple[
        str, list[tuple[str, str]], int | None]:
    """`CallReader.scan` for a syntax whose every `trigger` begins a call: the text between calls
    is kept unless it is only `separator_chars`, and the first call that is not complete or does
    not read ends the scan: its position is returned, and it and what follows stay in the text."""
    calls: list[tuple[str, str]] = []
    kept: list[str] = []
    pos = 0
    broken = None
    while True:
        at = text.find(trigger, pos)
        if at < 0:
            break
        found = call_at(text, at)
        if found is None:
            broken = at
            break
        end, read = found
        kept.append(text[pos:at])
        calls += read
        pos = end
    kept.append(text[pos:])
    return "".join(piece for piece in kept if piece.strip(separator_chars)), calls, broken


def skip_space(text: str, pos: int) -> int:
    """The first position at or after `pos` that is not whitespace (or the text's end)."""
    while pos < len(text) and text[pos] in " \n\t\r":
        pos += 1
    return pos
