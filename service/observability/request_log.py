"""One log line per finished request, with its numbers also as structured fields.

    request req-3#3 stop: 41 prompt + 17 output tokens (16 cached, 9 forced), queued 0.004 s,
    grammar wait 0.021 s (compiled), first token 0.210 s, total 0.950 s, constraint json_schema

With `--log-format json` (engine/log_format.py) the same numbers arrive as the "request" object.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.frontend.output_processor import RequestOutput
    from grammar.constraint import Constraint

# the name log pipelines filter on (docs/observability.md), kept from before the module moved
logger = logging.getLogger("service.request_log")


def request_fields(output: RequestOutput, constraint: Constraint | None) -> dict[str, Any]:
    """The finished request's numbers (its final output), under short stable names."""
    timings = output.timings
    fields: dict[str, Any] = {
        "id": output.request_id,
        "status": output.finish_reason.name.lower() if output.finish_reason is not None else "unknown",
        "prompt_tokens": output.num_prompt_tokens,
        "output_tokens": output.num_output_tokens,
        "cached_tokens": output.counters.num_cached_tokens,
        "forced_tokens": output.counters.num_forced_tokens,
        "constraint": constraint.kind if constraint is not None else "none",
        "grammar_cache_hit": output.grammar_cache_hit,
    }
    if timings is not None:
        fields.update(queued_s=round(timings.queued_s, 6), grammar_wait_s=round(timings.grammar_wait_s, 6),
                      ttft_s=round(timings.ttft_s, 6), total_s=round(timings.total_s, 6))
    if output.error:
        fields["error"] = output.error
    return fields


def log_finished(output: RequestOutput, constraint: Constraint | None) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    f = request_fields(output, constraint)
    grammar = ""
    if constraint is not None:
        grammar = f", grammar wait {f.get('grammar_wait_s', 0.0):.3f} s ({'cached' if f['grammar_cache_hit'] else 'compiled'})"
    error = f", error: {f['error']}" if "error" in f else ""
    logger.info("request %s %s: %d prompt + %d output tokens (%d cached, %d forced), queued %.3f s%s, first token "
                "%.3f s, total %.3f s, constraint %s%s", f["id"], f["status"], f["prompt_tokens"], f["output_tokens"],
                f["cached_tokens"], f["forced_tokens"], f.get("queued_s", 0.0), grammar, f.get("ttft_s", 0.0),
                f.get("total_s", 0.0), f["constraint"], error, extra={"request": f})
