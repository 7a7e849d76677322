"""The engine core in a child process: the service's client.

Transport: a multiprocessing duplex Pipe (a Unix socketpair) carrying msgpack-encoded msgspec
structs, rather than ZMQ: it needs no extra dependency, frames messages itself (send_bytes /
recv_bytes), and turns the core's death into EOF at once. One front end talks to one core, so
ZMQ's routing and multi-peer sockets would buy nothing.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from engine.core.core_proc import run_engine_core
from engine.core.memory_watchdog import EXIT_MEMORY_CEILING
from engine.frontend.core_client import EngineCoreClient, EngineDeadError
from engine.protocol import EngineCoreDead, EngineCoreInput, EngineCoreMessage, EngineCoreReady, Shutdown

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.memory_watchdog import MemoryLimit

logger = logging.getLogger(__name__)


class AsyncMPClient(EngineCoreClient):
    """Runs the engine core in a child process ('spawn': no forked torch or event-loop state).

    A reader thread waits on the connection and on the process sentinel together, so the core's
    death (a crash, a kill -9, an OOM kill) fails every in-flight request within milliseconds.
    `memory_limit` (engine/core/memory_watchdog.py) makes the child police its own RSS.
    """

    def __init__(self, config: EngineConfig, *, core_factory: Callable[[EngineConfig], Any] | None = None,
                 log_level: int = logging.INFO, memory_limit: MemoryLimit | None = None,
                 log_format: str = "text") -> None:
        super().__init__()
        self.config = config
        self._core_factory = core_factory  # picklable; None: the real EngineCore
        self._log_level = log_level
        self._log_format = log_format  # the engine process's logs: "text" or "json"
        self._memory_limit = memory_limit
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._ready: asyncio.Future[EngineCoreReady] | None = None
        self._exited: asyncio.Event = asyncio.Event()
        self.exit_description: str | None = None  # how the last process ended, once it has

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> EngineCoreReady:
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._exited = asyncio.Event()
        self.exit_description = None
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe(duplex=True)
        self._process = context.Process(
            target=run_engine_core,
            args=(self.config, child_conn, self._core_factory, self._log_level, self._memory_limit,
                  self._log_format),
            name="formwork-engine-core")
        self._process.start()
        child_conn.close()  # only the child holds its end now, so the child's death reads as EOF here
        threading.Thread(target=self._read_loop, args=(self._conn, self._process), name="formwork-engine-output",
                         daemon=True).start()
        self.info = await self._ready
        return self.info

    def _send(self, message: EngineCoreInput) -> None:
        assert self._conn is not None
        self._conn.send_bytes(self._encoder.encode(message))

    def _read_loop(self, conn: multiprocessing.connection.Connection,
                   process: multiprocessing.process.BaseProcess) -> None:
        """Reader thread of one core process: decode its messages onto the event loop; report its
        death. Callbacks name their process, so a restarted client ignores a dead one's news."""
        decoder = msgspec.msgpack.Decoder(EngineCoreMessage)
        while True:
            try:
                ready = multiprocessing.connection.wait([conn, process.sentinel])
                if conn not in ready:
                    break  # the process exited and nothing is left to read
                message = decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                break
            except msgspec.DecodeError:
                logger.exception("engine client: undecodable message from the core dropped")
                continue
            self._call_soon(self._on_message, process, message)
        process.join(timeout=5.0)
        self._call_soon(self._on_exit, process, describe_exit(process.exitcode))

    def _on_message(self, process: multiprocessing.process.BaseProcess, message: EngineCoreMessage) -> None:
        if process is not self._process:
            return
        if isinstance(message, EngineCoreReady):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
            return
        self._dispatch(message)
        if isinstance(message, EngineCoreDead) and self._ready is not None and not self._ready.done():
            self._ready.set_exception(EngineDeadError(message.error))

    def _on_exit(self, process: multiprocessing.process.BaseProcess, how: str) -> None:
        if process is not self._process:
            return
        self.exit_description = how
        self._exited.set()
        self._fail(f"the engine process {how}")
        if self._ready is not None and not self._ready.done():
            assert self._dead is not None
            self._ready.set_exception(self._dead)

    async def reap(self, timeout_s: float = 10.0) -> str | None:
        process = self._process
        if process is None:
            return None
        try:
            await asyncio.wait_for(self._exited.wait(), timeout_s)
        except asyncio.TimeoutError:  # it said its last words but hangs: make sure it is gone
            logger.warning("engine process %d did not exit within %.0f s of failing; killing it", process.pid,
                           timeout_s)
            process.kill()
            await asyncio.get_running_loop().run_in_executor(None, process.join, 5.0)
            self.exit_description = describe_exit(process.exitcode)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        return self.exit_description

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        process = self._process
        if process is None:
            return
        if self._dead is None and self._conn is not None:
            try:
                self._send(Shutdown())
            except OSError:
                pass
        await asyncio.get_running_loop().run_in_executor(None, process.join, timeout_s)
        if process.exitcode is None:  # stuck: the engine ignores SIGTERM, so kill it
            logger.warning("engine process %d did not stop within %.0f s; killing it", process.pid, timeout_s)
            process.kill()
            await asyncio.get_running_loop().run_in_executor(None, process.join, 5.0)
        self._fail("the engine was shut down", expected=True)
        if self._conn is not None:
            self._conn.close()


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, for logs and errors: its exit code, or the signal that killed it."""
    if exitcode is None:
        return "closed its connection"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"was killed by signal {-exitcode}"
        if name == "SIGKILL":  # nothing but the kernel's OOM killer or a kill -9 sends it
            return f"was killed by signal {-exitcode} ({name}: the kernel's OOM killer, or kill -9)"
        return f"was killed by signal {-exitcode} ({name})"
    if exitcode == EXIT_MEMORY_CEILING:
        return f"exited with code {exitcode} (over its memory ceiling)"
    return f"exited with code {exitcode}"
