"""SchemaWorker: the pure-Python part of a large schema's compile, in a process of its own.

Most of a large JSON schema's compile is Python (Formwork's rewrite to an enforceable schema, the
bounds of its grammar). In the engine's process that work holds the GIL: however low its thread's
CPU priority, the engine thread waits for the GIL whenever the compile is preempted holding it,
and a small request beside a heavy compile slows by half. In a process of its own the work only
takes a CPU, in Linux's idle class, and the engine's interpreter is left alone. The native
compile (xgrammar, llguidance) stays in the engine's process: its result cannot leave it.

One worker, started by the first call that would use it (which runs in the caller's thread, as
do the calls until the worker has imported the code: seconds), at the lowest priority, serving
one call at a time; a call made while it is busy runs in the caller's thread, as does the work of
a small spec (too short to matter). Like the compile threads (grammar/runtime/low_priority.py),
a worker kept from a CPU for STARVED_AFTER_S is rescued: moved to the normal class where the
process may, else stopped and its call run in the caller's thread. A worker that dies fails the
call it was serving (SchemaWorkerCrashed) and is started again by the next one.
"""
from __future__ import annotations

import importlib
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, TypeVar

from grammar.runtime.low_priority import STARVED_AFTER_S, ThreadScheduling

logger = logging.getLogger(__name__)

# spec characters below which the work runs in the caller's thread: such a spec's Python work takes
# a few ms, holding the GIL too briefly to slow a step (a call's round trip to the worker costs
# about 0.2 ms, docs/reliability.md)
MIN_SPEC_CHARS = 4096
# how often a waiting caller looks at the worker (alive, starved)
_POLL_S = 0.02
_EXIT_WAIT_S = 1.0  # for the exit code of a worker whose pipe closed
_HEADER = struct.Struct("<Q")  # a message's length in bytes, before its pickle

T = TypeVar("T")


class SchemaWorkerCrashed(RuntimeError):
    """The worker process exited while it served this call; the next call starts a new one."""


class SchemaWorker:
    """Runs module-level functions of picklable arguments in the worker process.

    `run` raises what the function raised (the same exception type and message: a GrammarError stays
    a GrammarError), SchemaWorkerCrashed when the worker died meanwhile. Thread-safe."""

    def __init__(self, min_spec_chars: int = MIN_SPEC_CHARS, scheduling: ThreadScheduling | None = None) -> None:
        self.min_spec_chars = min_spec_chars
        self._scheduling = scheduling or ThreadScheduling()
        self._nice = self._scheduling.own_nice()
        self._may_restore = self._scheduling.may_restore(self._nice)
        self._busy = threading.Lock()  # held by the one call the worker serves
        self._process: subprocess.Popen | None = None
        self._warming: str | None = None  # the module a new worker is importing, until it answers
        self._closed = False  # shut down: every call runs here
        self._lock = threading.Lock()  # guards _waited and the swap of _process
        # caller's native thread id -> seconds the worker waited for a CPU while serving its calls
        self._waited: dict[int, float] = {}
        self.num_calls = 0  # calls the worker answered
        self.num_crashes = 0
        self.num_rescues = 0

    def run(self, fn: Callable[..., T], *args: Any, num_chars: int = 0) -> T:
        """`fn(*args)` in the worker when `num_chars` (the spec's size) reaches min_spec_chars and
        the worker is free, else here."""
        if num_chars < self.min_spec_chars or self._closed or not self._busy.acquire(blocking=False):
            return fn(*args)
        try:
            if not self._ready(fn):
                return fn(*args)
            return self._call(fn, args)
        finally:
            self._busy.release()

    def waited_s(self, thread_id: int) -> float:
        """Seconds the worker has waited for a CPU while serving the calls of thread `thread_id`
        (by native id): time a compile's limit does not count, as for its own thread's waits."""
        with self._lock:
            return self._waited.get(thread_id, 0.0)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def shutdown(self) -> None:
        """Stop the worker; a call it was serving fails (SchemaWorkerCrashed), later calls run here."""
        self._closed = True
        self._stop()

    # -- internals ------------------------------------------------------------------------

    def _ready(self, fn: Callable) -> bool:
        """Whether the worker is up and has imported `fn`'s module; if not, starts it (importing the
        module, seconds) and answers False: the call runs here rather than wait for that."""
        if self._process is not None and self._process.poll() is None and self._warming is None:
            return True
        if self._process is None or self._process.poll() is not None:
            self._start(fn.__module__)
            return False
        process, warming = self._process, self._warming
        assert process.stdout is not None
        if not select.select([process.stdout], [], [], 0)[0]:
            return False
        try:
            _read(process.stdout)  # the import's outcome: a failed one fails the first call instead
        except (EOFError, OSError, pickle.UnpicklingError):
            self._stop()
            return False
        logger.info("schema worker ready (pid %d, %s imported)", process.pid, warming)
        self._warming = None
        return True

    def _call(self, fn: Callable[..., T], args: tuple) -> T:
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            _write(process.stdin, (fn, args))
        except (BrokenPipeError, OSError):
            raise self._crashed(process) from None
        caller = threading.get_native_id()
        start_wait = last_wait = _process_cpu_wait_s(process.pid)
        rescued = False
        while True:
            ready, _, _ = select.select([process.stdout], [], [], _POLL_S)
            wait = _process_cpu_wait_s(process.pid)
            with self._lock:
                self._waited[caller] = self._waited.get(caller, 0.0) + max(0.0, wait - last_wait)
            last_wait = wait
            if ready:
                break
            if process.poll() is not None:
                raise self._crashed(process)
            if not rescued and wait - start_wait >= STARVED_AFTER_S:
                rescued = True
                self.num_rescues += 1
                if not (self._may_restore and self._scheduling.restore(process.pid, self._nice)):
                    logger.info("schema worker starved and may not be raised; running its call in this thread")
                    self._stop()
                    return fn(*args)
        try:
            ok, value = _read(process.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            raise self._crashed(process) from None
        self.num_calls += 1
        if ok:
            return value
        raise value

    def _start(self, module: str) -> None:
        """A new worker process, first importing `module` (Python's own path, so the same code)."""
        self._stop()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        process = subprocess.Popen([sys.executable, "-m", "grammar.schema_worker"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, env=env, close_fds=True)
        assert process.stdin is not None
        _write(process.stdin, (importlib.import_module, (module,)))
        self._process, self._warming = process, module
        logger.info("schema worker starting (pid %d)", process.pid)

    def _crashed(self, process: subprocess.Popen) -> SchemaWorkerCrashed:
        try:  # its pipe closes a moment before it can be reaped
            code = process.wait(timeout=_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        self.num_crashes += 1
        self._stop()
        logger.warning("schema worker (pid %d) exited with code %s during a call", process.pid, code)
        return SchemaWorkerCrashed(f"the schema worker process exited (code {code}) while preparing this "
                                   "constraint; it starts again with the next compile")

    def _stop(self) -> None:
        with self._lock:
            process, self._process, self._warming = self._process, None, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def _process_cpu_wait_s(pid: int) -> float:
    """Seconds the process's main thread (the worker's only working one) waited for a CPU."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _write(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the stream ended")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the stream ended")
    return pickle.loads(data)


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The worker's loop: each call in the idle class (a rescue may have raised it), its outcome
    sent back as (True, result) or (False, exception)."""
    scheduling = ThreadScheduling()
    while True:
        try:
            fn, args = _read(requests)
        except EOFError:
            return  # the engine closed its end
        scheduling.demote(threading.get_native_id())
        try:
            reply: tuple[bool, Any] = (True, fn(*args))
        except BaseException as e:  # every outcome goes back: a GrammarError, a MemoryError, a bug
            reply = (False, e)
        try:
            _write(replies, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # an outcome that cannot travel
            _write(replies, (False, RuntimeError(f"the schema worker's answer could not be sent: "
                                                 f"{type(e).__name__}: {e}")))


if __name__ == "__main__":
    # stdout carries replies only: anything else the work prints goes to stderr
    _replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, _replies)
