"""Capture what a native library prints to file descriptor 2 during one call.

xgrammar's C++ code reports the parts of a schema it will not enforce ("... is not supported;
ignoring minLength/maxLength") straight to stderr, with no Python hook or log level. To turn those
lines into data we point fd 2 at a temporary file for the duration of the call.

fd 2 belongs to the whole process, so: captures are serialised by one lock; lines that other
threads happened to write meanwhile are written back to the real stderr afterwards (delayed, not
lost); and a capture should wrap only short calls (schema -> grammar conversion takes
milliseconds; the long token-mask compilation runs outside it).
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()

# "[19:10:50] /project/cpp/json_schema_converter.cc:1199: Warning: pattern combined with ..."
_NATIVE_LINE = re.compile(r"^\[[0-9:]+\] \S+\.(?:cc|h|cpp):\d+: (?:Warning: )?(?P<text>.*)$")


@contextmanager
def capture_native_log() -> Iterator[list[str]]:
    """Yield a list that, after the block, holds the native log lines printed inside it.

    Only lines in the native logger's format are kept (their prefix stripped); anything else
    written to fd 2 meanwhile is passed through to the real stderr.
    """
    lines: list[str] = []
    with _lock, tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stderr.flush()  # text Python already buffered belongs to the real stderr
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            passthrough: list[str] = []
            for raw in sink.read().decode(errors="replace").splitlines():
                match = _NATIVE_LINE.match(raw)
                if match:
                    lines.append(match.group("text").strip())
                elif raw:
                    passthrough.append(raw)
            if passthrough:
                sys.stderr.write("\n".join(passthrough) + "\n")


def strip_native_prefix(message: str) -> str:
    """An xgrammar exception message without its "[time] file.cc:line: " prefix."""
    out = []
    for raw in message.strip().splitlines():
        match = _NATIVE_LINE.match(raw.strip())
        out.append(match.group("text") if match else raw.strip())
    return " ".join(line for line in out if line)
