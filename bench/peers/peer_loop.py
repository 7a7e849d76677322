"""What every async peer script does around its own `one(request)`: warm each distinct schema once,
then run each run's requests at its concurrency. Plain Python, imported by the peer scripts from
their own folder (they run in the peers' interpreters, without Formwork installed)."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

OneRequest = Callable[..., Awaitable[dict]]


async def warm_schemas(payload: dict, one: OneRequest) -> float:
    """One one-token request per distinct (prompt, schema, whitespace) and per distinct tool-call chat,
    so no run pays a compile and, as in Formwork's warm-up (bench/structured.py, bench/serve_bench.py),
    every prompt is in the prefix cache; its seconds."""
    started = time.perf_counter()
    seen, warm = set(), []
    for run in payload["runs"]:
        for r in run["requests"]:
            key = json.dumps([r.get("prompt_token_ids"), r["schema"], r.get("any_whitespace", False), r.get("tools"),
                              r.get("tool_choice"), r.get("messages")], sort_keys=True)
            if key not in seen:
                seen.add(key)
                warm.append(r)
    await asyncio.gather(*(one(r, max_tokens=1) for r in warm))
    return time.perf_counter() - started


async def run_all(payload: dict, one: OneRequest) -> list[dict]:
    """The contract's "runs": each run's requests with at most `concurrency` in flight."""
    runs_out = []
    for run in payload["runs"]:
        gate = asyncio.Semaphore(run["concurrency"])

        async def gated(r: dict) -> dict:
            async with gate:
                return await one(r)

        run_start = time.perf_counter()
        records = await asyncio.gather(*(gated(r) for r in run["requests"]))
        runs_out.append({"name": run["name"], "concurrency": run["concurrency"],
                         "wall_s": time.perf_counter() - run_start, "records": list(records)})
    return runs_out
