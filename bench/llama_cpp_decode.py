"""Formwork beside llama.cpp on the same prompts, one request at a time and a few at once.

    python -m bench.llama_cpp_decode [--model M] [--gguf FILE] [--settings int8,bf16]
                                     [--modes unconstrained,constrained] [--concurrency 1,8]
                                     [--threads 1] [--max-tokens 128] [--rounds 2] [--no-llama-cpp]
                                     [--widened-model DIR]

The first 8 person paragraphs of `formwork bench accuracy` (name, age, email, city), greedy, max_tokens
128, as the same prompt token ids to both. llama.cpp (`make peer-llama-cpp`, bench/peers/
llama_cpp_peer.py) serves --gguf (default: the packaged Q4_1 file) with its JSON-schema grammar
when constrained; Formwork serves --model (default: the packaged model; a .gguf file is served from
its own blocks under int8: 4-bit weights in 4-bit) per setting: "bf16" (no quantization), "int8", or
"int8-widened" (the model dequantized, then every matmul and the head quantized per channel to int8:
how a 4-bit file was served before the 4-bit GEMM). llama-cpp-python runs
one sequence at a time, so at concurrency c it answers the c requests one after another; Formwork
takes them in one batch. Formwork's prefix cache is off (every prompt is prefilled, as a new user's
would be; llama.cpp keeps only the previous prompt's common prefix) and each schema is compiled
before the clock starts, as llama.cpp's grammar is converted before it.

Per system, mode and concurrency: output tokens / wall seconds (the prompt's prefill included), and
one request's decode tokens/s (its tokens after the first / its time after the first token, summed
over the requests: at c > 1 a request's own pace inside its batch). Rounds alternate the systems; each keeps its best round.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

SETTINGS = {"bf16": None, "int8": "int8", "int8-widened": "int8"}
NUM_ITEMS = 8  # the first 8 person paragraphs: a timing run needs a few prompts, not the accuracy set


def _items():
    from bench.accuracy import load_items
    return load_items(["person"])[:NUM_ITEMS]


def _params(schema: dict | None, max_tokens: int):
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint
    constraint = None if schema is None else Constraint(kind="json_schema", spec=json.dumps(schema))
    return SamplingParams(temperature=0, max_tokens=max_tokens, constraint=constraint)


def formwork_run(llm, prompts: list[list[int]], schemas: list[dict | None], max_tokens: int,
                 concurrency: int) -> dict:
    """The prompts in batches of `concurrency` (one after another); tokens, wall and decode seconds."""
    tokens = decode_tokens = 0
    decode_s = 0.0
    started = time.perf_counter()
    for i in range(0, len(prompts), concurrency):
        batch = [{"prompt_token_ids": p} for p in prompts[i:i + concurrency]]
        outputs = llm.generate(batch, [_params(s, max_tokens) for s in schemas[i:i + concurrency]])
        for o in outputs:
            tokens += o.num_output_tokens
            if o.num_output_tokens > 1 and o.timings is not None:
                decode_tokens += o.num_output_tokens - 1
                decode_s += o.timings.total_s - o.timings.ttft_s
    wall = time.perf_counter() - started
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "decode_tok_s": decode_tokens / decode_s if decode_s else 0.0}


def llama_cpp_runs(gguf: str, threads: int, prompts: list[list[int]], schemas: list[dict | None],
                   max_tokens: int, names: list[str], extra_bufts: bool | None) -> tuple[dict[str, dict], str]:
    """Every mode's requests through the llama.cpp peer in one process; per mode, the same figures."""
    from bench.peers import PEERS, run_peer
    runs = [{"name": name, "concurrency": 1,
             "requests": [{"id": f"{name}-{i}", "prompt_token_ids": p, "schema": s if name == "constrained" else None,
                           "max_tokens": max_tokens} for i, (p, s) in enumerate(zip(prompts, schemas))]}
            for name in names]
    payload = {"gguf": gguf, "threads": threads, "runs": runs}
    if extra_bufts is not None:
        payload["extra_bufts"] = extra_bufts
    result = run_peer(PEERS["llama-cpp"], payload, timeout_s=3600)
    out = {}
    for run in result["runs"]:
        tokens = sum(r["num_output_tokens"] for r in run["records"])
        decode = [(r["num_output_tokens"] - 1, r["e2e_s"] - r["ttft_s"]) for r in run["records"]
                  if r["num_output_tokens"] > 1]
        decode_s = sum(s for _, s in decode)
        out[run["name"]] = {"tokens": tokens, "wall_s": run["wall_s"], "tok_s": tokens / run["wall_s"],
                            "decode_tok_s": sum(n for n, _ in decode) / decode_s if decode_s else 0.0}
    return out, result.get("version", "llama-cpp")


def _widened_model(model: str | None) -> str:
    """The folder of the model dequantized (a GGUF file's, the packaged one's), which int8 quantizes per channel."""
    from pathlib import Path

    from engine.model_files import prepare_default_model, prepare_gguf
    if model is None:
        return str(prepare_default_model())
    return str(prepare_gguf(Path(model))) if model.endswith(".gguf") else model


def _load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="Formwork's model (default: the packaged one)")
    parser.add_argument("--gguf", default=None, help="llama.cpp's files, a comma list (default: the packaged Q4_1)")
    parser.add_argument("--settings", default="int8,bf16", help=f"comma list of {', '.join(SETTINGS)}")
    parser.add_argument("--modes", default="unconstrained,constrained")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp's threads (two collapse when another process is busy on a 2-core machine)")
    parser.add_argument("--extra-bufts", action=argparse.BooleanOptionalAction, default=None,
                        help="llama.cpp with its extra buffer types (AMX, repacked layouts); default: off on a CPU "
                             "with AMX-INT8, where they crash (bench/peers/llama_cpp_peer.py)")
    parser.add_argument("--no-llama-cpp", action="store_true", help="Formwork's settings only")
    parser.add_argument("--widened-model", default=None,
                        help="int8-widened's model folder (default: --model dequantized; a random one of the "
                             "same shape serves the same speed)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-speculation", action="store_true", help="Formwork without its prompt-lookup drafts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from bench.peers import PeerSkipped
    from engine.config import CacheConfig, EngineConfig, SpeculativeConfig
    from engine.llm import LLM
    from engine.model_files import default_gguf_path

    settings = args.settings.split(",")
    modes = args.modes.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    ggufs = [] if args.no_llama_cpp else (args.gguf or str(default_gguf_path())).split(",")
    items = _items()
    base = EngineConfig(model=args.model, cache=CacheConfig(enable_prefix_caching=False),
                        speculative=SpeculativeConfig(enabled=False if args.no_speculation else None))

    def formwork(setting: str) -> LLM:
        if setting == "int8-widened":  # the model dequantized; every matmul and the head per channel
            return LLM(config=replace(base, model=args.widened_model or _widened_model(args.model),
                                      quantization="int8", quantize_lm_head=True))
        return LLM(config=replace(base, quantization=SETTINGS[setting]))

    llms = {s: formwork(s) for s in settings}
    prompts = [next(iter(llms.values())).encode_prompt(item.messages["schema"]) for item in items]
    schemas = {"unconstrained": [None] * len(items), "constrained": [item.schema for item in items]}
    for llm in llms.values():  # compile each schema and touch every code path before any clock
        formwork_run(llm, prompts[:2], schemas["constrained"][:2], 4, 2)
    best: dict[tuple[str, str, int], dict] = {}
    version = ""

    def keep(key, figures, load):
        figures = {**figures, "load": load}
        if key not in best or figures["tok_s"] > best[key]["tok_s"]:
            best[key] = figures
        print(f"  {key[0]:<16} {key[1]:<13} c={key[2]}: {figures['tok_s']:6.1f} tok/s, decode "
              f"{figures['decode_tok_s']:6.1f} tok/s, {figures['tokens']} tokens in {figures['wall_s']:.2f} s "
              f"(load {load})", flush=True)

    try:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1} ({time.strftime('%H:%M:%S', time.gmtime())} UTC)", flush=True)
            for setting, llm in llms.items():
                for mode in modes:
                    for c in levels:
                        keep((f"formwork {setting}", mode, c),
                             formwork_run(llm, prompts, schemas[mode], args.max_tokens, c), _load_average())
            for gguf in ggufs:
                load = _load_average()
                try:
                    runs, version = llama_cpp_runs(gguf, args.threads, prompts, schemas["constrained"],
                                                   args.max_tokens, modes, args.extra_bufts)
                except PeerSkipped as e:
                    print(f"  llama.cpp skipped: {e}", flush=True)
                    runs = {}
                label = "llama.cpp" if len(ggufs) == 1 else f"llama.cpp {os.path.basename(gguf)}"
                for mode, figures in runs.items():
                    keep((label, mode, 1), figures, load)
    finally:
        for llm in llms.values():
            llm.shutdown()
    print(f"\nbest rounds ({version}, {args.threads} threads; llama.cpp one request at a time):")
    print(f"{'system':<48} {'mode':<14} {'c':>2} {'tok/s':>7} {'decode tok/s':>12} {'wall s':>7}  load")
    for (system, mode, c), f in sorted(best.items()):
        print(f"{system:<48} {mode:<14} {c:>2} {f['tok_s']:7.1f} {f['decode_tok_s']:12.1f} {f['wall_s']:7.2f}  {f['load']}")
    if args.output:
        with open(args.output, "w") as out:
            json.dump({"version": version, "rows": [{"system": s, "mode": m, "concurrency": c, **f}
                                                    for (s, m, c), f in best.items()]}, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
