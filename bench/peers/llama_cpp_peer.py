"""Peer: llama.cpp through llama-cpp-python, on the same GGUF file Formwork's weights come from.

A standalone script for .peers/llama-cpp/bin/python (see bench/peers/__init__.py for the
contract). The schema becomes a GBNF grammar with llama-cpp-python's own JSON-schema converter.
llama-cpp-python's `Llama` runs one sequence at a time, so requests run one after another
whatever the concurrency asked; times are from the start of each request. One thread by
default: with two, llama.cpp collapsed whenever the other core was busy (docs/benchmarks.md).
"extra_bufts": false in the payload loads the weights without llama.cpp's extra buffer types (its
AMX and repacked layouts), the default on a CPU with AMX-INT8: on the Xeon with AMX here, ggml's AMX
matmul (ggml_backend_amx_mul_mat) crashes with a segmentation fault in llama-cpp-python 0.3.36, on
Q4_1 and Q8_0 files alike.
"""
from __future__ import annotations

import json
import sys
import time


def _has_amx_int8() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def main() -> int:
    payload = json.load(sys.stdin)
    try:
        import llama_cpp
        from llama_cpp import Llama, LlamaGrammar
    except ImportError as e:
        print(json.dumps({"skipped": f"llama-cpp-python is not importable here: {e}"}))
        return 0
    threads = payload.get("threads") or 1
    if not payload.get("extra_bufts", not _has_amx_int8()):
        import llama_cpp.llama_cpp as bindings  # the ctypes module Llama() takes its model parameters from
        default_params = bindings.llama_model_default_params

        def without_extra_bufts():
            params = default_params()
            params.use_extra_bufts = False
            return params

        bindings.llama_model_default_params = without_extra_bufts
    started = time.perf_counter()
    llm = Llama(model_path=payload["gguf"], n_ctx=payload.get("n_ctx", 2048), n_threads=threads,
                n_threads_batch=threads, n_batch=512, verbose=False)
    load_s = time.perf_counter() - started
    eos = llm.token_eos()
    grammars: dict[str, object] = {}
    runs_out = []
    for run in payload["runs"]:
        records = []
        run_start = time.perf_counter()
        for r in run["requests"]:
            grammar = None
            if r["schema"] is not None:
                key = json.dumps(r["schema"], sort_keys=True)
                if key not in grammars:  # converted before the clock starts, like a cached grammar
                    grammars[key] = LlamaGrammar.from_json_schema(json.dumps(r["schema"]), verbose=False)
                grammar = grammars[key]
            tokens, times, finish = [], [], "length"
            start = time.perf_counter()
            for token in llm.generate(r["prompt_token_ids"], temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                      repeat_penalty=1.0, grammar=grammar):
                times.append(time.perf_counter() - start)
                tokens.append(token)
                if token == eos:
                    finish = "stop"
                    break
                if len(tokens) >= r["max_tokens"]:
                    break
            text_tokens = tokens[:-1] if finish == "stop" else tokens
            records.append({"id": r["id"], "text": llm.detokenize(text_tokens).decode("utf-8", errors="replace"),
                            "finish_reason": finish, "num_prompt_tokens": len(r["prompt_token_ids"]),
                            "num_output_tokens": len(tokens), "ttft_s": times[0] if times else 0.0,
                            "e2e_s": times[-1] if times else 0.0, "token_times_s": times})
        runs_out.append({"name": run["name"], "concurrency": 1, "wall_s": time.perf_counter() - run_start,
                         "records": records})
    print(json.dumps({"peer": "llama-cpp", "version": f"llama-cpp-python {llama_cpp.__version__}, {threads} thread(s)",
                      "load_s": load_s, "notes": ["one sequence at a time: concurrency is 1 whatever was asked"],
                      "runs": runs_out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
