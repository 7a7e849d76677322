"""Peer: transformers `generate` with xgrammar's logits processor (the always-available baseline).

A standalone script (see bench/peers/__init__.py for the stdin/stdout contract). "Concurrency N"
is static batching: requests go in batches of N, left-padded, greedy, and a batch ends when its
longest answer does. Token times come from a stopping criterion, called once per decode step.
"""
from __future__ import annotations

import json
import sys
import time


def _grammar_key(request: dict) -> str:
    return json.dumps([request["schema"], request.get("any_whitespace", False)], sort_keys=True)


def main() -> int:
    payload = json.load(sys.stdin)
    import torch
    import transformers
    import xgrammar as xgr
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, StoppingCriteria
    from xgrammar.contrib.hf import LogitsProcessor

    if payload.get("threads"):
        torch.set_num_threads(payload["threads"])
    started = time.perf_counter()
    model_dir = payload["model_dir"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, payload.get("dtype", "float32"))).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=config.vocab_size))
    load_s = time.perf_counter() - started
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    class StepClock(StoppingCriteria):
        """Records when each decode step's token was appended; never stops generation."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    runs_out = []
    for run in payload["runs"]:
        requests, n = run["requests"], run["concurrency"]
        grammars = {}
        for r in requests:  # compiled before the clock starts, as Formwork's are (cached)
            if r["schema"] is not None:
                key = _grammar_key(r)
                if key not in grammars:
                    grammars[key] = compiler.compile_json_schema(json.dumps(r["schema"]),
                                                                 any_whitespace=r.get("any_whitespace", False))
        records = []
        run_start = time.perf_counter()
        for i in range(0, len(requests), n):
            batch = requests[i:i + n]
            width = max(len(r["prompt_token_ids"]) for r in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, r in enumerate(batch):
                p = r["prompt_token_ids"]
                ids[row, width - len(p):] = torch.tensor(p)
                mask[row, width - len(p):] = 1
            processors = []
            if batch[0]["schema"] is not None:
                processors = [LogitsProcessor([grammars[_grammar_key(r)] for r in batch])]
            clock = StepClock()
            batch_start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(r["max_tokens"] for r in batch),
                                     do_sample=False, logits_processor=processors, stopping_criteria=[clock],
                                     pad_token_id=pad)
            for row, r in enumerate(batch):
                tokens = out[row, width:].tolist()[:r["max_tokens"]]
                finish = "length"
                if eos in tokens:
                    tokens = tokens[:tokens.index(eos) + 1]
                    finish = "stop"
                times = [t - batch_start for t in clock.times[:len(tokens)]]
                records.append({"id": r["id"], "text": tokenizer.decode(tokens, skip_special_tokens=True),
                                "finish_reason": finish, "num_prompt_tokens": len(r["prompt_token_ids"]),
                                "num_output_tokens": len(tokens), "ttft_s": times[0] if times else 0.0,
                                "e2e_s": times[-1] if times else 0.0, "token_times_s": times})
        runs_out.append({"name": run["name"], "concurrency": n, "wall_s": time.perf_counter() - run_start,
                         "records": records})
    version = (f"transformers {transformers.__version__}, xgrammar {getattr(xgr, '__version__', '?')}, "
               f"torch {torch.__version__} ({torch.get_num_threads()} threads, {model.dtype})")
    print(json.dumps({"peer": "transformers", "version": version,
                      "load_s": load_s, "notes": ["static batching: a batch ends when its longest answer does"],
                      "runs": runs_out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
