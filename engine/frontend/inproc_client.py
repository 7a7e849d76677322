"""The engine core's busy loop in a thread of this process (tests, tools)."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from engine.core.core_proc import EngineCoreProc, ready_message
from engine.frontend.core_client import EngineCoreClient
from engine.protocol import EngineCoreInput, EngineCoreMessage, EngineCoreReady, Shutdown

logger = logging.getLogger(__name__)


class InprocClient(EngineCoreClient):
    """Runs the engine core's busy loop in a thread of this process (tests, tools).

    Messages take the same msgpack round trip as over the process boundary, so what works here
    crosses the wire too.
    """

    def __init__(self, core_factory: Callable[[], Any]) -> None:
        super().__init__()
        self._core_factory = core_factory  # called on a worker thread by start()
        self._proc: EngineCoreProc | None = None
        self._thread: threading.Thread | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._input_decoder = msgspec.msgpack.Decoder(EngineCoreInput)
        self._output_decoder = msgspec.msgpack.Decoder(EngineCoreMessage)

    async def start(self) -> EngineCoreReady:
        self._loop = asyncio.get_running_loop()
        try:
            engine_core = await self._loop.run_in_executor(None, self._core_factory)
        except Exception as e:
            self._fail(f"the engine failed to start: {type(e).__name__}: {e}")
            raise self._dead from None
        proc = EngineCoreProc(engine_core, lambda message: self._send_from_core(proc, message))
        self._proc = proc
        self._thread = threading.Thread(target=self._run, args=(proc,), name="formwork-engine-core", daemon=True)
        self._thread.start()
        self.info = ready_message(engine_core)
        return self.info

    def _run(self, proc: EngineCoreProc) -> None:
        try:
            proc.run_busy_loop()
        except Exception as e:
            logger.exception("engine core failed")
            self._call_soon(self._fail_from_core, proc, f"the engine core failed: {type(e).__name__}: {e}")
        finally:
            proc.shutdown()

    def _send(self, message: EngineCoreInput) -> None:
        assert self._proc is not None
        self._proc.input_queue.put(self._input_decoder.decode(self._encoder.encode(message)))

    def _send_from_core(self, proc: EngineCoreProc, message: Any) -> None:
        decoded = self._output_decoder.decode(self._encoder.encode(message))
        self._call_soon(self._dispatch_from_core, proc, decoded)

    # the core of a restarted client is a new EngineCoreProc: news from an old one is dropped
    def _dispatch_from_core(self, proc: EngineCoreProc, message: EngineCoreMessage) -> None:
        if proc is self._proc:
            self._dispatch(message)

    def _fail_from_core(self, proc: EngineCoreProc, reason: str) -> None:
        if proc is self._proc:
            self._fail(reason)

    async def reap(self) -> str | None:
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)
        return None

    async def shutdown(self) -> None:
        if self._proc is not None and self._dead is None:
            self._proc.input_queue.put(Shutdown())
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)
        self._fail("the engine was shut down", expected=True)
