"""The front end's handle on an engine core: the interface both clients share.

`EngineCoreClient` is one small asyncio interface: `start()`, `add_request()` (returns the
request's own output stream), `abort_requests()`, `get_stats()`, `validate_constraint()`,
`is_alive` / `wait_dead()`, `restart()`, `shutdown()`. Call them from one event loop. The client
reports a death; whether and when to restart is the caller's policy (service/supervisor.py).
The engine core runs in a child process (engine/frontend/mp_client.py, the service's) or in a
thread of this process (engine/frontend/inproc_client.py, tests and tools).

Imports neither torch nor grpc: the service imports this module.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.protocol import (AbortRequests, ConstraintReport, EngineCoreDead, EngineCoreInput, EngineCoreMessage,
                             EngineCoreOutput, EngineCoreOutputs, EngineCoreReady, EngineCoreRequest, EngineStats,
                             GetStats, StepStats, ValidateConstraint)

if TYPE_CHECKING:
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
