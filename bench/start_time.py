"""Seconds from `LLM()` to ready, and to a first short answer, in a fresh process each time.

    python -m bench.start_time [--quantization int8] [--model DIR|FILE] [--repeats 3]

What a restarted server or a new offline user waits before the first token: reading the weights,
packing or quantizing them, the grammar backends, the engine's first step.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

_ONE_START = """
import json, sys, time
from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
args = json.loads(sys.argv[1])
started = time.perf_counter()
llm = LLM(model=args["model"], config=EngineConfig(quantization=args["quantization"]))
ready = time.perf_counter() - started
llm.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(temperature=0, max_tokens=4))
print(json.dumps({"ready_s": ready, "first_answer_s": time.perf_counter() - started}))
llm.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantization", default=None, help="e.g. int8 (default: none)")
    parser.add_argument("--model", default=None, help="model folder or GGUF file (default: the packaged model)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    payload = json.dumps({"model": args.model, "quantization": args.quantization})
    runs = []
    for _ in range(args.repeats):  # a fresh process each: imports and file reads as a restart pays them
        out = subprocess.run([sys.executable, "-c", _ONE_START, payload], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"ready {runs[-1]['ready_s']:.2f} s, first answer {runs[-1]['first_answer_s']:.2f} s", flush=True)
    print(f"best of {len(runs)}: ready {min(r['ready_s'] for r in runs):.2f} s, "
          f"first answer {min(r['first_answer_s'] for r in runs):.2f} s")


if __name__ == "__main__":
    main()
