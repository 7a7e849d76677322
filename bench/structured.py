"""`formwork bench offline --workload json-extraction`: the price (or gain) of structure.

One process, the same prompts: unconstrained, constrained, constrained with jump-forward, and
transformers' generate with xgrammar's logits processor, at several batch sizes (all requests of a
batch submitted at once). Prints tokens/s, the structured/unconstrained ratios, validity and field
accuracy, and the step time split (forward vs bitmask fill vs mask+sample) that shows the overlap.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from bench.workloads import extraction_prompt, load_json_extraction


@dataclass
class RunResult:
    mode: str
    batch_size: int
    num_requests: int
    seconds: float
    output_tokens: int
    forward_passes: int
    valid: int
    length_capped: int
    field_accuracy: float
    step_split: dict | None = None
    lengths: list[int] | None = None  # output tokens of each request

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def field_accuracy(expected: dict, got: dict) -> float:
    keys = list(expected)
    return sum(1 for k in keys if got.get(k) == expected[k]) / max(len(keys), 1)


def score(items, texts: list[str], schemas: list[dict]) -> tuple[int, float]:
    import jsonschema
    valid, accuracy = 0, []
    for item, text, schema in zip(items, texts, schemas):
        try:
            value = json.loads(text)
            jsonschema.Draft202012Validator(schema).validate(value)
        except (ValueError, jsonschema.ValidationError):
            accuracy.append(0.0)
            continue
        valid += 1
        accuracy.append(field_accuracy(item["expected"], value))
    return valid, statistics.mean(accuracy) if accuracy else 0.0


def split_summary(timings) -> dict:
    """Median step split over decode-only steps (one token per request)."""
    decode = [t for t in timings if t.num_tokens == t.num_reqs] or timings
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    total = med([t.total_s for t in decode])
    return {"steps": len(decode), "total_ms": 1e3 * total, "forward_ms": 1e3 * med([t.forward_s for t in decode]),
            "fill_ms": 1e3 * med([t.fill_s for t in decode]), "wait_ms": 1e3 * med([t.wait_s for t in decode]),
            "sample_ms": 1e3 * med([t.sample_s for t in decode]),
            "sample_share": med([t.sample_s / t.total_s for t in decode])}


CACHE_STATE = ("every prompt in the prefix cache before each timed run (a one-token request each, not counted), "
               "for Formwork's modes and every peer alike; transformers generate has no prefix cache")


def run_formwork(llm, items, mode: str, batch_size: int, max_tokens: int,
                 lengths: list[int] | None = None) -> RunResult:
    """lengths (mode unconstrained-matched): each answer's exact length, EOS ignored."""
    from engine.protocol import FinishReason
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint

    params = []
    for i, item in enumerate(items):
        if mode == "unconstrained-matched":
            params.append(SamplingParams(temperature=0, max_tokens=max(1, lengths[i]), ignore_eos=True))
            continue
        constraint = None
        if mode != "unconstrained":
            constraint = Constraint(kind="json_schema", spec=json.dumps(item["schema"]),
                                    jump_forward=(mode == "constrained+jf"))
        params.append(SamplingParams(temperature=0, max_tokens=max_tokens, constraint=constraint))
    prompts = [extraction_prompt(item) for item in items]
    # every mode and every peer meets the same cache (CACHE_STATE): the previous mode's goes, then each
    # prompt once, one token, unconstrained, as bench/peers/peer_loop.py warms the peers
    llm.engine.reset_prefix_cache()
    llm.generate(prompts, SamplingParams(max_tokens=1))
    llm.engine.step_stats.take_timings()  # the warm-up's steps
    start = time.perf_counter()
    # all at once: the engine keeps batch_size (= max_num_seqs) running and admits the next request
    # as soon as one finishes, so short (grammar-completed) outputs do not leave the batch half empty
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    timings = llm.engine.step_stats.take_timings()
    valid, accuracy = score(items, [o.text for o in outputs], [item["schema"] for item in items])
    return RunResult(mode, batch_size, len(items), seconds, sum(o.num_output_tokens for o in outputs),
                     sum(o.counters.num_forward_passes for o in outputs), valid,
                     sum(o.finish_reason == FinishReason.LENGTH for o in outputs), accuracy, split_summary(timings),
                     [o.num_output_tokens for o in outputs])


def run_transformers(model_dir, tokenizer, items, batch_size: int, max_tokens: int,
                     dtype: str = "float32") -> RunResult:
    """transformers generate (static batches) with xgrammar's logits processor."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grammar.constraint import Constraint
    from grammar.xgrammar.backend import XGrammarBackend
    from grammar.xgrammar.matcher import hf_logits_processor

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    hf_tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    backend = XGrammarBackend(str(model_dir), model.config.vocab_size)  # the same grammars Formwork uses
    texts, output_tokens = [], 0
    start = time.perf_counter()
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        prompts = [tokenizer.apply_chat_template(extraction_prompt(item)) for item in chunk]
        batch = hf_tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        processor = hf_logits_processor(
            [backend.compile(Constraint(kind="json_schema", spec=json.dumps(item["schema"]))) for item in chunk])
        with torch.inference_mode():
            out = model.generate(**batch, max_new_tokens=max_tokens, do_sample=False, logits_processor=[processor],
                                 pad_token_id=hf_tok.pad_token_id)
        for row in out[:, batch["input_ids"].shape[1]:].tolist():
            ids = row[:row.index(hf_tok.eos_token_id) + 1] if hf_tok.eos_token_id in row else row
            output_tokens += len(ids)
            texts.append(hf_tok.decode(ids, skip_special_tokens=True))
    seconds = time.perf_counter() - start
    valid, accuracy = score(items, texts, [item["schema"] for item in items])
    return RunResult("transformers+xgrammar", batch_size, len(items), seconds, output_tokens, 0, valid, 0, accuracy)


def run_peers(names: list[str], tokenizer, chunks: dict[int, list[dict]], max_tokens: int, model_dir,
              dtype: str) -> list[RunResult]:
    """Each peer (bench/peers) on the same chunk at each batch size: `batch` requests in flight at once,
    greedy, the same prompt tokens and schemas; scored as Formwork's answers are."""
    from bench.peers import PEERS, PeerSkipped, run_peer

    requests = {b: [{"id": f"{b}-{i}", "prompt_token_ids": tokenizer.encode_chat(extraction_prompt(item)),
                     "schema": item["schema"], "max_tokens": max_tokens} for i, item in enumerate(chunk)]
                for b, chunk in chunks.items()}
    payload = {"model_dir": str(model_dir), "gguf": "", "threads": 2, "dtype": dtype,
               "runs": [{"name": f"constrained batch {b}", "concurrency": b, "requests": rs}
                        for b, rs in requests.items()]}
    results = []
    for name in names:
        try:
            out = run_peer(PEERS[name], payload, timeout_s=3600)
        except (PeerSkipped, RuntimeError) as e:
            print(f"{name}: not run: {str(e)[-600:]}", flush=True)
            continue
        print(f"{name}: {out.get('version')}, load {out.get('load_s', 0):.0f} s (not counted); "
              f"{'; '.join(out.get('notes', []))}", flush=True)
        for run in out["runs"]:
            chunk, records = chunks[run["concurrency"]], run["records"]
            valid, accuracy = score(chunk, [r["text"] for r in records], [item["schema"] for item in chunk])
            results.append(RunResult(name, run["concurrency"], len(records), run["wall_s"],
                                     sum(r["num_output_tokens"] for r in records), 0, valid,
                                     sum(r.get("finish_reason") == "length" for r in records), accuracy))
    return results


def print_result(r: RunResult) -> None:
    line = (f"{r.mode:<22} batch {r.batch_size:>3}: {r.tokens_per_s:7.1f} tok/s  {r.output_tokens:>5} tokens "
            f"in {r.seconds:6.1f} s  valid {r.valid}/{r.num_requests}  capped {r.length_capped}  "
            f"field acc {r.field_accuracy:.2f}")
    if r.forward_passes:
        line += f"  fwd/token {r.forward_passes / max(r.output_tokens, 1):.2f}"
    print(line, flush=True)
    s = r.step_split
    if s and r.mode.startswith("constrained"):
        print(f"{'':<24}decode step {s['total_ms']:.1f} ms: forward {s['forward_ms']:.1f}, bitmask fill "
              f"{s['fill_ms']:.2f} (beside the forward), wait {s['wait_ms']:.1f}, mask+sample "
              f"{s['sample_ms']:.2f} ms = {100 * s['sample_share']:.1f}% of the step", flush=True)


def print_ratios(by_mode: dict[str, RunResult]) -> None:
    """Structure's price against the same work without it: unconstrained answers exactly as long
    as the constrained ones (same prompts, same token counts). Plain unconstrained answers run on to
    max_tokens, so their tok/s weighs a different mix of prefill and decode."""
    matched, constrained, jf = by_mode["unconstrained-matched"], by_mode["constrained"], by_mode["constrained+jf"]
    print(f"{'':<24}structured / length-matched unconstrained: {constrained.tokens_per_s / matched.tokens_per_s:.3f} "
          f"tok/s; jump-forward {jf.tokens_per_s / matched.tokens_per_s:.3f} tok/s, "
          f"{matched.seconds / jf.seconds:.3f} answers/s (same requests)", flush=True)
    print(f"{'':<24}against plain unconstrained (to max_tokens): "
          f"{constrained.tokens_per_s / by_mode['unconstrained'].tokens_per_s:.3f} "
          f"(jump-forward {jf.tokens_per_s / by_mode['unconstrained'].tokens_per_s:.3f})", flush=True)


def main(args, engine_config) -> int:
    from dataclasses import replace

    from engine.config import SchedulerConfig
    from engine.llm import LLM

    items = load_json_extraction()[:args.items or None]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    results = []
    print(f"json-extraction: {len(items)} items, max_tokens {args.max_tokens}, greedy; batch size = requests "
          f"in flight (max_num_seqs), twice as many requests as that (8 at batch 1); {CACHE_STATE}", flush=True)
    model_dir = tokenizer = None
    chunks = {b: [items[i % len(items)] for i in range(max(8, 2 * b))] for b in batch_sizes}
    for batch_size in batch_sizes:
        llm = LLM(config=replace(engine_config, scheduler=SchedulerConfig(
            max_num_seqs=batch_size, max_num_batched_tokens=engine_config.scheduler.max_num_batched_tokens)))
        llm.generate([extraction_prompt(items[0])], None)  # warm-up
        model_dir, tokenizer = llm.engine.model_dir, llm.tokenizer
        chunk = chunks[batch_size]
        # compile every grammar before timing (as a server that has seen these schemas): the runs
        # measure steady decoding; a cold compile is ~6 ms a schema here, on its own thread
        run_formwork(llm, chunk, "constrained", batch_size, 1)
        # rounds alternate the modes, and each keeps its fastest: one run of a mode moved by 5% between
        # rounds here (other work on a 2-core machine), more than the effects measured
        by_mode: dict[str, RunResult] = {}
        for _ in range(max(1, args.repeats)):
            for mode in ("constrained", "unconstrained-matched", "constrained+jf", "unconstrained"):
                r = run_formwork(llm, chunk, mode, batch_size, args.max_tokens,
                                 by_mode["constrained"].lengths if "constrained" in by_mode else None)
                if mode not in by_mode or r.seconds < by_mode[mode].seconds:
                    by_mode[mode] = r
        for r in by_mode.values():
            results.append(r)
            print_result(r)
        print_ratios(by_mode)
        llm.shutdown()
    if args.peers:
        for r in run_peers(args.peers, tokenizer, chunks, args.max_tokens, model_dir, engine_config.torch_dtype):
            results.append(r)
            print_result(r)
    if not args.skip_transformers:
        for batch_size in [b for b in batch_sizes if b <= args.hf_max_batch]:
            chunk = [items[i % len(items)] for i in range(max(batch_size, 8))]
            r = run_transformers(model_dir, tokenizer, chunk, batch_size, args.max_tokens, engine_config.torch_dtype)
            results.append(r)
            print_result(r)
    if args.output:
        with open(args.output, "w") as f:
            json.dump([r.__dict__ | {"tokens_per_s": r.tokens_per_s} for r in results], f, indent=1)
    return 0
