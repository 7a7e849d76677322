"""The front end's handle on an engine core: in a child process (the service) or in this process.

Both clients share one small asyncio interface, `EngineCoreClient`: `start()`, `add_request()`
(returns the request's own output stream), `abort_requests()`, `get_stats()`,
`validate_constraint()`, `is_alive` / `wait_dead()`, `restart()`, `shutdown()`. Call them from one
event loop. The client reports a death; whether and when to restart is the caller's policy
(service/supervisor.py).

Transport of `AsyncMPClient`: a multiprocessing duplex Pipe (a Unix socketpair) carrying
msgpack-encoded msgspec structs, rather than ZMQ: it needs no extra dependency, frames messages
itself (send_bytes / recv_bytes), and turns the core's death into EOF at once. One front end talks
to one core, so ZMQ's routing and multi-peer sockets would buy nothing.

Imports neither torch nor grpc: the service imports this module.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from engine.core.core_proc import EngineCoreProc, ready_message, run_engine_core
from engine.core.memory_watchdog import EXIT_MEMORY_CEILING
from engine.protocol import (AbortRequests, ConstraintReport, EngineCoreDead, EngineCoreInput, EngineCoreMessage,
                             EngineCoreOutput, EngineCoreOutputs, EngineCoreReady, EngineCoreRequest, EngineStats,
                             GetStats, Shutdown, StepStats, ValidateConstraint)

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.memory_watchdog import MemoryLimit
    from grammar.constraint import Constraint

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine core is gone (its process died, or a step failed); every call fails with it.

    `in_flight` names what was in flight when it died, the suspects if a request killed it:
    request id -> its constraint (None: unconstrained), and "validate:<call id>" -> the constraint
    a validation was compiling.
    """

    def __init__(self, reason: str, in_flight: dict[str, Constraint | None] | None = None) -> None:
        super().__init__(reason)
        self.in_flight: dict[str, Constraint | None] = in_flight or {}


class RequestOutputStream:
    """One request's EngineCoreOutputs, in order. The last one has `finish_reason` set; if the
    core dies first, `get()` raises EngineDeadError instead."""

    def __init__(self, request_id: str, constraint: Constraint | None = None) -> None:
        self.request_id = request_id
        self.constraint = constraint
        self._queue: asyncio.Queue[EngineCoreOutput | EngineDeadError] = asyncio.Queue()

    def put(self, item: EngineCoreOutput | EngineDeadError) -> None:
        self._queue.put_nowait(item)

    async def get(self) -> EngineCoreOutput:
        item = await self._queue.get()
        if isinstance(item, EngineDeadError):
            raise item
        return item


class EngineCoreClient(ABC):
    """Routes core outputs to per-request streams and answers calls; subclasses move the bytes.

    Invariants: a request's stream is dropped once its final output is routed or it is aborted
    (later outputs for it are ignored); after the core dies every open stream and call fails with
    the same EngineDeadError, and so does every later call until `restart()` has a new core up.
    """

    def __init__(self) -> None:
        self.info: EngineCoreReady | None = None  # set by start(); None again while restarting
        self._streams: dict[str, RequestOutputStream] = {}
        self._calls: dict[int, asyncio.Future[EngineCoreOutputs]] = {}
        self._call_constraints: dict[int, Constraint] = {}  # call id -> the constraint a validation compiles
        self._call_ids = itertools.count(1)
        self._dead: EngineDeadError | None = None
        self._dead_event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # called (on the event loop) with each StepStats the core reports, before that message's
        # outputs and call answers are routed: a stats call then sees them counted
        self.on_step_stats: Callable[[StepStats], None] | None = None

    # ---- the interface ------------------------------------------------------------------------

    @abstractmethod
    async def start(self) -> EngineCoreReady:
        """Start the core and wait until it is loaded; EngineDeadError if it cannot start."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the core (unfinished requests are dropped). Idempotent."""

    @abstractmethod
    def _send(self, message: EngineCoreInput) -> None:
        """Hand one message to the core (raise OSError if it cannot be delivered)."""

    @abstractmethod
    async def reap(self) -> str | None:
        """After a death: wait until the dead core's process (or thread) is gone; how it ended
        ("was killed by signal 9 (SIGKILL)", "exited with code 1"), or None if unknown."""

    async def restart(self) -> EngineCoreReady:
        """Start a new core after this one died, with the same configuration; the dead core's
        streams and calls have failed already. Raises EngineDeadError if the new one cannot start."""
        if self._dead is None:
            raise RuntimeError("the engine core is running; only a dead one is restarted")
        await self.reap()
        self.info = None
        self._dead = None
        self._dead_event = asyncio.Event()
        return await self.start()

    def add_request(self, request: EngineCoreRequest) -> RequestOutputStream:
        """Queue a request in the core; its outputs arrive on the returned stream."""
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        stream = RequestOutputStream(request.request_id, request.sampling_params.constraint)
        self._deliver(request)
        self._streams[request.request_id] = stream
        return stream

    def abort_requests(self, request_ids: list[str]) -> None:
        """Abort requests in the core, in any state (frees their KV blocks); unknown or finished ids
        are ignored, and nothing is sent once the core is dead."""
        for request_id in request_ids:
            self._streams.pop(request_id, None)
        if request_ids and self._dead is None:
            try:
                self._deliver(AbortRequests(list(request_ids)))
            except EngineDeadError:
                pass  # dead: nothing left to free

    async def get_stats(self) -> EngineStats:
        answer = await self._call(GetStats(call_id=next(self._call_ids)))
        assert answer.stats is not None
        return answer.stats

    async def validate_constraint(self, constraint: Constraint) -> ConstraintReport:
        """Compile `constraint` in the core (warming its cache) without generating."""
        call_id = next(self._call_ids)
        self._call_constraints[call_id] = constraint
        try:
            answer = await self._call(ValidateConstraint(call_id=call_id, constraint=constraint))
        finally:
            del self._call_constraints[call_id]
        assert answer.report is not None
        return answer.report

    @property
    def is_alive(self) -> bool:
        return self.info is not None and self._dead is None

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead

    async def wait_dead(self) -> EngineDeadError:
        """Return once the core is dead (or shut down)."""
        await self._dead_event.wait()
        assert self._dead is not None
        return self._dead

    # ---- shared mechanics ---------------------------------------------------------------------

    def _deliver(self, message: EngineCoreInput) -> None:
        if self._dead is not None:
            raise self._dead
        try:
            self._send(message)
        except OSError as e:
            self._fail(f"the engine core is unreachable: {e}")
            raise self._dead from None

    async def _call(self, message: GetStats | ValidateConstraint) -> EngineCoreOutputs:
        future = asyncio.get_running_loop().create_future()
        self._calls[message.call_id] = future
        try:
            self._deliver(message)
            return await future
        finally:
            self._calls.pop(message.call_id, None)

    def _dispatch(self, message: EngineCoreMessage) -> None:
        """Route one message from the core (on the event loop)."""
        if isinstance(message, EngineCoreOutputs):
            if message.step_stats is not None and self.on_step_stats is not None:
                self.on_step_stats(message.step_stats)
            for output in message.outputs:
                stream = self._streams.get(output.request_id)
                if stream is None:
                    continue  # aborted here; the core had not seen the abort yet
                if output.finish_reason is not None:
                    del self._streams[output.request_id]
                stream.put(output)
            if message.call_id:
                future = self._calls.get(message.call_id)
                if future is not None and not future.done():
                    future.set_result(message)
        elif isinstance(message, EngineCoreDead):
            self._fail(message.error)
        else:
            logger.error("engine client: unexpected %s from the core", type(message).__name__)

    def _fail(self, reason: str, expected: bool = False) -> None:
        """The core is gone: fail every stream and call, now and later (on the event loop)."""
        if self._dead is not None:
            return
        logger.log(logging.INFO if expected else logging.WARNING, "engine core stopped: %s", reason)
        streams, self._streams = self._streams, {}
        in_flight: dict[str, Constraint | None] = {id_: s.constraint for id_, s in streams.items()}
        in_flight.update({f"validate:{call_id}": c for call_id, c in self._call_constraints.items()})
        self._dead = EngineDeadError(reason, in_flight)
        for stream in streams.values():
            stream.put(self._dead)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(self._dead)
        self._dead_event.set()

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` on the event loop, from any thread; dropped once the loop is closed."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody is listening any more


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
