"""Microbenchmark: bitmask application on V=49,152 logits, xgrammar's kernel vs grammar.bitmask.

    OMP_WAIT_POLICY=PASSIVE python -m bench.bitmask [--repeats 30] [--device cuda] [--tokenizer DIR]

Masks are real: rows recorded while feeding JSON documents through grammars compiled for the
SmolLM2 tokenizer — "sparse" rows between JSON tokens (1-15 tokens allowed), "dense" rows inside
strings (~48,800 allowed), and "mixed" batches drawn from all rows of the documents. Prints the
median microseconds per row; on the CPU torch runs on one thread, as xgrammar's CPU kernel does.
With --device cuda the logits live on the GPU and the (CPU-filled) bitmask is copied over in
every call, as in the engine; "ours" is then grammar.bitmask's torch fallback for devices
without a registered kernel.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from grammar.bitmask import apply_bitmask, masked_argmax

VOCAB_SIZE = 49152
BATCH_SIZES = (1, 8, 32, 64)

_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"}, "year": {"type": "integer"},
        "authors": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "affiliation": {"type": "string"}}, "required": ["name", "affiliation"]}},
        "summary": {"type": "string"}, "score": {"type": "number"}, "open": {"type": "boolean"},
        "status": {"enum": ["draft", "review", "final"]},
    },
    "required": ["title", "year", "authors", "summary", "score", "open", "status"],
}
_DOCUMENTS = [
    {"title": "Attention Is All You Need", "year": 2017,
     "authors": [{"name": "Ashish Vaswani", "affiliation": "Google Brain"},
                 {"name": "Noam Shazeer", "affiliation": "Google Brain"}],
     "summary": "The dominant sequence transduction models are based on complex recurrent networks.",
     "score": 9.5, "open": True, "status": "final"},
    {"title": "A Note", "year": 1999, "authors": [], "summary": "Short.", "score": -1.25, "open": False,
     "status": "draft"},
]


def record_masks(tokenizer_dir: str | None = None) -> torch.Tensor:
    """Bitmask rows at every position of the documents, under the schema's grammar."""
    from grammar.constraint import Constraint
    from grammar.xgrammar.backend import XGrammarBackend

    if tokenizer_dir is None:
        from engine.model_files import resolve_model

        tokenizer_dir = str(resolve_model(None))
    backend = XGrammarBackend(tokenizer_dir, VOCAB_SIZE)
    compiled = backend.compile(Constraint("json_schema", json.dumps(_SCHEMA)))
    rows = []
    for document in _DOCUMENTS:
        grammar = backend.make_grammar(compiled)
        bitmask = backend.allocate_bitmask(1)
        for token_id in backend.tokenizer.encode(json.dumps(document, separators=(",", ":")), add_special_tokens=False):
            grammar.fill_bitmask(bitmask, 0)
            rows.append(bitmask[0].clone())
            if not grammar.accept_tokens([token_id]):
                raise RuntimeError("benchmark document does not match its schema")
    return torch.stack(rows)


def _median_us(fn, make_args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        args = make_args()
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e6


def _pools(masks: torch.Tensor) -> dict[str, torch.Tensor]:
    num_allowed = np.bitwise_count(masks.numpy().view(np.uint32)).sum(axis=1)
    return {"sparse": masks[torch.from_numpy(num_allowed < 1000)],
            "dense": masks[torch.from_numpy(num_allowed >= 1000)], "mixed": masks}


def run(repeats: int = 30, tokenizer_dir: str | None = None) -> list[dict]:
    """CPU: xgrammar's kernel vs apply_bitmask, and the greedy paths (us per row)."""
    from grammar.xgrammar.matcher import apply_bitmask_xgrammar

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    results = []
    for shape, pool in _pools(record_masks(tokenizer_dir)).items():
        for batch in BATCH_SIZES:
            bitmask = pool[torch.from_numpy(rng.integers(0, len(pool), batch))].contiguous()
            logits = torch.randn(batch, VOCAB_SIZE)
            fresh = lambda: (logits.clone(), bitmask)  # noqa: E731
            row = {"shape": shape, "batch": batch}
            row["xgrammar"] = _median_us(lambda lg, bm: apply_bitmask_xgrammar(lg, bm, None), fresh, repeats) / batch
            row["apply_bitmask"] = _median_us(apply_bitmask, fresh, repeats) / batch
            row["apply+torch.argmax"] = _median_us(
                lambda lg, bm: (apply_bitmask(lg, bm), lg.argmax(dim=1)), fresh, repeats) / batch
            row["apply+numpy argmax"] = _median_us(
                lambda lg, bm: (apply_bitmask(lg, bm), lg.numpy().argmax(axis=1)), fresh, repeats) / batch
            row["masked_argmax"] = _median_us(masked_argmax, fresh, repeats) / batch
            results.append(row)
    return results


def run_cuda(repeats: int = 30, tokenizer_dir: str | None = None) -> list[dict]:
    """CUDA: xgrammar's kernel (through grammar.bitmask's hook) vs the torch fallback."""
    from grammar import bitmask as bitmask_ops
    from grammar.xgrammar import matcher  # registers the CUDA kernel

    def timed(fn, make_args) -> float:
        def call(*args):
            fn(*args)
            torch.cuda.synchronize()
        return _median_us(call, make_args, repeats)

    rng = np.random.default_rng(0)
    results = []
    for shape, pool in _pools(record_masks(tokenizer_dir)).items():
        for batch in BATCH_SIZES:
            bitmask = pool[torch.from_numpy(rng.integers(0, len(pool), batch))].contiguous()
            logits = torch.randn(batch, VOCAB_SIZE, device="cuda")
            fresh = lambda: (logits.clone(), bitmask)  # noqa: E731
            for _ in range(3):  # warm up (triton compiles its kernel on first use)
                apply_bitmask(*fresh())
            row = {"shape": shape, "batch": batch}
            row["xgrammar"] = timed(apply_bitmask, fresh) / batch
            row["xgrammar masked_argmax"] = timed(masked_argmax, fresh) / batch
            del bitmask_ops._device_kernels["cuda"]
            try:
                apply_bitmask(*fresh())
                row["torch fallback"] = timed(apply_bitmask, fresh) / batch
            finally:
                bitmask_ops.register_device_kernel("cuda", matcher.apply_bitmask_xgrammar)
            results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tokenizer", help="model folder with the tokenizer (default: the prepared SmolLM2)")
    args = parser.parse_args()
    runner = run_cuda if args.device == "cuda" else run
    results = runner(args.repeats, args.tokenizer)
    columns = [c for c in results[0] if c not in ("shape", "batch")]
    print("| rows | batch | " + " | ".join(f"{c} (us/row)" for c in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for row in results:
        print(f"| {row['shape']} | {row['batch']} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
