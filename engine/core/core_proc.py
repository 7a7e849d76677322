"""The engine core's own loop, and the main of the engine process.

    input thread ──► input_queue ──► busy loop: EngineCore.step() ──► send(EngineCoreOutputs)
    memory watchdog ─┘ (engine process only: RSS past the soft limit / back below it)

The busy loop steps while the core has work and blocks on the input queue while it has none, so
an idle engine costs nothing. Inputs are drained between steps: a request added or aborted waits
at most one step. The same loop runs in a child process (`run_engine_core`, fed by a connection)
or in a thread of the front end's process (`engine.frontend.inproc_client.InprocClient`).

Never imports grpc; imports torch only through EngineCore, inside the engine process.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import msgspec

from engine.core.host_memory import release_free_heap
from engine.core.memory_watchdog import EXIT_MEMORY_CEILING, MemoryLimit, MemoryWatchdog, format_gib, rss_bytes
from engine.log_format import configure_logging
from engine.protocol import (AbortRequests, ConstraintReport, EngineCoreDead, EngineCoreInput, EngineCoreOutput,
                             EngineCoreOutputs, EngineCoreReady, EngineCoreRequest, ErrorKind, FinishReason, GetStats,
                             Shutdown, ValidateConstraint)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from engine.config import EngineConfig

logger = logging.getLogger(__name__)


class MemoryPressure(msgspec.Struct, frozen=True):
    """From the memory watchdog to the busy loop (never on the wire): RSS crossed the soft limit."""

    over: bool  # True: rose past it; False: fell below it again
    description: str  # "RSS 17.31 GiB over the soft limit 17.10 GiB"


class MemoryCeilingExceeded(RuntimeError):
    """The engine stays over its soft memory limit with no request left to finish: it exits so
    that a fresh process can start."""


def ready_message(engine_core: Any, pid: int = 0) -> EngineCoreReady:
    """Describe a constructed EngineCore (or anything with the same attributes)."""
    config = engine_core.config
    return EngineCoreReady(
        model_name=engine_core.model_name,
        model_dir=str(engine_core.model_dir),
        max_model_len=engine_core.max_model_len,
        vocab_size=engine_core.vocab_size,
        eos_token_id=engine_core.eos_token_id,
        block_size=config.cache.block_size,
        num_total_blocks=engine_core.get_stats().num_total_blocks,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_waiting=config.scheduler.max_num_waiting,
        pid=pid,
    )


class EngineCoreProc:
    """The busy loop around one EngineCore.

    Inputs arrive on `input_queue`; everything the core says leaves through `send` (one message per
    call, from the loop's thread or the validation thread: `send` must be thread-safe).
    The core is driven from the loop's thread only; `validate_constraint` runs on a helper thread so
    a slow compile never stalls generation (it only touches the grammar compiler, which is
    thread-safe: it compiles on its own pool).
    """

    def __init__(self, engine_core: Any, send: Callable[[Any], None]) -> None:
        self.engine_core = engine_core
        self.input_queue: queue.Queue[Any] = queue.Queue()
        self._send = send
        self._validator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="formwork-validate")
        self.memory_pressure: str | None = None  # why new requests are refused, while RSS is over the soft limit

    def run_busy_loop(self) -> None:
        """Step while there is work; block on the input queue while there is none. Returns on
        Shutdown; a step that raises propagates (the engine is then dead), and so does
        MemoryCeilingExceeded once the engine is idle but still over its soft memory limit."""
        core = self.engine_core
        while self._handle_inputs(block=not core.has_unfinished_requests()):
            if core.has_unfinished_requests():
                outputs = core.step()
                if outputs:
                    self._send(EngineCoreOutputs(outputs=outputs, step_stats=core.take_step_stats()))
                core.outputs_delivered()
            if self.memory_pressure is not None and not core.has_unfinished_requests():
                raise MemoryCeilingExceeded(f"{self.memory_pressure} with no request left to finish")

    def shutdown(self) -> None:
        self._validator.shutdown(wait=False, cancel_futures=True)
        self.engine_core.shutdown()

    def _handle_inputs(self, block: bool) -> bool:
        """Handle every queued input (waiting for the first one if `block`); False on Shutdown."""
        try:
            message = self.input_queue.get(block=block)
        except queue.Empty:
            return True
        while True:
            if isinstance(message, Shutdown):
                return False
            self._handle(message)
            try:
                message = self.input_queue.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, message: Any) -> None:
        core = self.engine_core
        if isinstance(message, EngineCoreRequest):
            if self.memory_pressure is not None:
                self._send(EngineCoreOutputs(outputs=[EngineCoreOutput(
                    message.request_id, finish_reason=int(FinishReason.ERROR), error_kind=ErrorKind.OVERLOADED,
                    error=f"the engine is short of memory ({self.memory_pressure}); retry later")]))
            else:
                core.add_request(message)  # an invalid request ends at once with an ERROR output
        elif isinstance(message, AbortRequests):
            core.abort_requests(message.request_ids)
        elif isinstance(message, GetStats):
            self._send(EngineCoreOutputs(call_id=message.call_id, stats=core.get_stats(),
                                         step_stats=core.take_step_stats()))
        elif isinstance(message, ValidateConstraint):
            self._validator.submit(self._validate, message)
        elif isinstance(message, MemoryPressure):
            self._on_memory_pressure(message)
        else:
            logger.error("engine core: unknown input %r dropped", type(message).__name__)

    def _on_memory_pressure(self, message: MemoryPressure) -> None:
        if not message.over:
            logger.info("memory back under the soft limit (%s); accepting requests again", message.description)
            self.memory_pressure = None
            return
        self.memory_pressure = message.description
        # a compile is the grammar work that grows outside a step: end the requests waiting on one
        num_failed = self.engine_core.fail_grammar_compiles(
            f"the engine ran short of memory ({message.description}) while this constraint compiled")
        logger.warning("memory: %s; refusing new requests, %d waiting on a grammar compile failed",
                       message.description, num_failed)

    def _validate(self, message: ValidateConstraint) -> None:
        try:
            report = self.engine_core.validate_constraint(message.constraint)
        except Exception as e:  # validate_constraint reports bad constraints itself; this is a bug
            logger.exception("validate_constraint failed")
            report = ConstraintReport(ok=False, error=f"internal error while compiling: {e}")
        self._send(EngineCoreOutputs(call_id=message.call_id, report=report))


# ---- the engine process -----------------------------------------------------------------------


def build_engine_core(config: EngineConfig) -> Any:
    from engine.core.engine_core import EngineCore  # torch and the model: engine process only
    return EngineCore(config)


def run_engine_core(config: EngineConfig, conn: Connection,
                    core_factory: Callable[[EngineConfig], Any] | None = None, log_level: int = logging.INFO,
                    memory_limit: MemoryLimit | None = None, log_format: str = "text") -> None:
    """Main of the engine process (a multiprocessing 'spawn' target).

    Sends EngineCoreReady once the core is built (or EngineCoreDead if it cannot be), then serves
    inputs until Shutdown or until the front end's end of `conn` closes (the front end died).
    Exits 0 after a clean shutdown, 1 after a failure, EXIT_MEMORY_CEILING when it stops itself
    over `memory_limit` (engine/core/memory_watchdog.py; None: no ceiling of its own). Logs go to
    stderr as text or, with `log_format` "json", one JSON object a line (engine/log_format.py).
    """
    configure_logging(log_level, log_format, prefix="[formwork engine]")
    # the front end decides when the engine stops: a Ctrl-C or SIGTERM sent to the whole process group
    # must not kill the engine under requests the front end is still finishing (its grace period)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    encoder = msgspec.msgpack.Encoder()
    send_lock = threading.Lock()

    def send(message: Any, timeout_s: float = -1) -> None:
        data = encoder.encode(message)
        if not send_lock.acquire(timeout=timeout_s):
            raise OSError("the connection to the front end is busy")
        try:
            conn.send_bytes(data)
        finally:
            send_lock.release()

    try:
        engine_core = (core_factory or build_engine_core)(config)
        ready = ready_message(engine_core, os.getpid())
    except BaseException as e:
        logger.exception("the engine failed to start")
        _send_last_words(send, f"the engine failed to start: {type(e).__name__}: {e}")
        sys.exit(1)
    proc = EngineCoreProc(engine_core, send)
    threading.Thread(target=_read_inputs, args=(conn, proc.input_queue), name="formwork-engine-input",
                     daemon=True).start()
    send(ready)
    logger.info("engine core ready: %s, %d KV blocks of %d tokens", ready.model_name, ready.num_total_blocks,
                ready.block_size)
    if memory_limit is not None:
        _start_memory_watchdog(memory_limit, proc, send)
    try:
        proc.run_busy_loop()
    except (BrokenPipeError, ConnectionResetError):
        logger.info("the front end is gone; stopping")  # nobody is left to tell
    except MemoryCeilingExceeded as e:
        logger.error("exiting for a fresh engine process: %s", e)
        _send_last_words(send, f"the engine process stopped itself: {e}")
        sys.exit(EXIT_MEMORY_CEILING)
    except BaseException as e:
        logger.error("engine core failed:\n%s", traceback.format_exc())
        _send_last_words(send, f"the engine core failed: {type(e).__name__}: {e}")
        sys.exit(1)
    finally:
        proc.shutdown()
    conn.close()


def _start_memory_watchdog(limit: MemoryLimit, proc: EngineCoreProc, send: Callable[..., None]) -> None:
    def on_pressure(over: bool, rss: int) -> None:
        if over:
            release_free_heap()  # off the engine thread; what it frees may bring RSS back under
        relation = "over" if over else "under"
        proc.input_queue.put(MemoryPressure(over, f"RSS {format_gib(rss)} {relation} the soft limit "
                                                  f"{format_gib(limit.soft_bytes)}"))

    def on_hard_limit(rss: int) -> None:
        error = (f"the engine process went over its memory ceiling: RSS {format_gib(rss)} > "
                 f"{format_gib(limit.hard_bytes)}; it exited so that a fresh one can start")
        logger.error("%s", error)
        # the engine thread may be inside a send that never ends: do not wait for it long
        _send_last_words(lambda message: send(message, timeout_s=1.0), error)
        logging.shutdown()
        os._exit(EXIT_MEMORY_CEILING)  # the engine thread may be stuck in native code: no clean unwinding

    MemoryWatchdog(limit, on_pressure, on_hard_limit).start()
    logger.info("memory ceiling: soft %s, hard %s (RSS now %s)", format_gib(limit.soft_bytes),
                format_gib(limit.hard_bytes), format_gib(rss_bytes()))


def _read_inputs(conn: Connection, input_queue: queue.Queue) -> None:
    """Input thread: decode front-end messages into the queue; EOF means the front end is gone."""
    decoder = msgspec.msgpack.Decoder(EngineCoreInput)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            input_queue.put(Shutdown())
            return
        try:
            input_queue.put(decoder.decode(data))
        except msgspec.DecodeError:
            logger.exception("engine core: undecodable input dropped")


def _send_last_words(send: Callable[[Any], None], error: str) -> None:
    try:
        send(EngineCoreDead(error=error))
    except OSError:
        pass  # the front end is gone too
