"""The engine's supervisor: when the core dies, restart it (bounded, with backoff) and quarantine
the constraints that keep killing it.

    core dies ─► in-flight requests fail with UNAVAILABLE (the client does that), health NOT_SERVING,
                 one log line: the cause, how the process ended, the requests lost, what happens next
             ─► the constraints in flight get a strike (service/quarantine.py)
             ─► wait (backoff), start a new core, warm it up ─► health SERVING

Crashes count as consecutive until a core stays up for `stable_s`; after `max_restarts`
consecutive ones the supervisor gives up: health stays NOT_SERVING and calls answer UNAVAILABLE,
for the orchestrator's liveness probe to act on.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.frontend.core_client import EngineDeadError
from service.quarantine import Quarantine

if TYPE_CHECKING:
    from grammar.constraint import Constraint
    from service.async_llm import AsyncLLM

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5  # consecutive crashes the engine is restarted after; 0: never restart
    backoff_s: float = 0.5  # wait before the first restart; doubled for each consecutive crash
    max_backoff_s: float = 30.0
    stable_s: float = 60.0  # a core that ran this long ends a run of consecutive crashes
    quarantine_s: float = 600.0  # how long a constraint in flight at two deaths is refused; 0: never

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"the engine restart limit must be >= 0, got {self.max_restarts}")
        for name in ("backoff_s", "max_backoff_s", "stable_s", "quarantine_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def backoff(self, num_consecutive: int) -> float:
        """Seconds to wait before restart number `num_consecutive` (1-based) of a run."""
        return min(self.backoff_s * 2 ** (num_consecutive - 1), self.max_backoff_s)


class EngineSupervisor:
    """Watches one AsyncLLM's core from the event loop; `run()` until cancelled or given up.

    `set_serving(bool)` flips the health status. Counters are read by GetModelInfo.
    """

    def __init__(self, llm: AsyncLLM, policy: RestartPolicy, quarantine: Quarantine,
                 set_serving: Callable[[bool], Awaitable[None]], clock: Callable[[], float] = time.monotonic) -> None:
        self.llm = llm
        self.policy = policy
        self.quarantine = quarantine
        self._set_serving = set_serving
        self._clock = clock
        self.num_restarts = 0  # cores started after a death, since the server started
        self.last_crash = ""  # the last death's cause, as logged
        self.gave_up = False
        self._num_consecutive = 0
        self._started_at = clock()

    async def run(self) -> None:
        while True:
            error = await self.llm.client.wait_dead()
            if self.llm.closing:
                return
            await self._set_serving(False)
            if not await self._recover(error):
                return

    async def _recover(self, error: EngineDeadError) -> bool:
        """Restart after `error`, retrying failed starts; False once the supervisor gave up."""
        while True:
            uptime = self._clock() - self._started_at
            self._num_consecutive = 1 if uptime >= self.policy.stable_s else self._num_consecutive + 1
            how = await self.llm.client.reap()
            self.gave_up = self._num_consecutive > self.policy.max_restarts
            quarantined = self.quarantine.record_strike(self.llm.crash_suspects(error))
            self.last_crash = f"{error}" + (f" (the process {how})" if how and how not in str(error) else "")
            num_requests = sum(not id_.startswith("validate:") for id_ in error.in_flight)
            logger.error("engine core died: %s; %d requests in flight failed with UNAVAILABLE; %s%s", self.last_crash,
                         num_requests, self._plan(), _describe_quarantined(quarantined, self.quarantine))
            if self.gave_up:
                self.llm.down_reason = f"it died {self._num_consecutive} times in a row and is not restarted"
                return False
            self.llm.down_reason = "it is restarting; retry once health reports SERVING"
            await asyncio.sleep(self.policy.backoff(self._num_consecutive))
            started = self._clock()
            try:
                info = await self.llm.restart()
                loaded = self._clock()
                await self.llm.warm_up()
            except Exception as e:  # it died while starting or warming up: one more crash of the run
                dead = self.llm.client.dead_error
                if dead is None:  # up, but its warm-up failed: not a core to serve from
                    await self.llm.client.shutdown()
                    dead = EngineDeadError(f"the restarted engine failed its warm-up: {e}")
                error = dead
                self._started_at = self._clock()
                continue
            self.num_restarts += 1
            self._started_at = self._clock()
            self.llm.down_reason = None
            await self._set_serving(True)
            logger.info("engine core restarted (pid %d): loaded in %.1f s, warm %.1f s later; health SERVING",
                        info.pid, loaded - started, self._clock() - loaded)
            return True

    def _plan(self) -> str:
        if not self.gave_up:
            return (f"restart {self._num_consecutive} of {self.policy.max_restarts} in "
                    f"{self.policy.backoff(self._num_consecutive):.1f} s")
        if self.policy.max_restarts == 0:
            return "restarts are off (--engine-restarts 0): health stays NOT_SERVING"
        return (f"{self._num_consecutive} crashes in a row, over the limit of {self.policy.max_restarts} "
                f"(--engine-restarts): not restarting; health stays NOT_SERVING")


def _describe_quarantined(constraints: list[Constraint], quarantine: Quarantine) -> str:
    if not constraints:
        return ""
    names = ", ".join(f"{c.kind} {(c.spec or '|'.join(c.choices))[:60]!r}" for c in constraints[:3])
    more = f" and {len(constraints) - 3} more" if len(constraints) > 3 else ""
    return (f"; quarantined for {quarantine.duration_s:.0f} s (in flight at {quarantine.strikes} deaths): "
            f"{names}{more}")
