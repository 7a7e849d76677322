"""Microbenchmark: bitmask application on V=49,152 logits, xgrammar's kernel vs grammar.bitmask.

    OMP_WAIT_POLICY=PASSIVE python -m grammar.bitmask_bench [--repeats 30]

Masks are real: rows recorded while feeding JSON documents through grammars compiled for the
SmolLM2 tokenizer — "sparse" rows between JSON tokens (1-15 tokens allowed), "dense" rows inside
strings (~48,800 allowed), and "mixed" batches drawn from all rows of the documents. Prints the
median microseconds per row; torch runs on one thread, as xgrammar's CPU kernel does.
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


def record_masks() -> torch.Tensor:
    """Bitmask rows at every position of the documents, under the schema's grammar."""
    from engine.model_files import resolve_model
    from engine.sampling_params import Constraint
    from grammar.xgrammar_backend import XGrammarBackend

    backend = XGrammarBackend(str(resolve_model(None)), VOCAB_SIZE)
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


def run(repeats: int = 30) -> list[dict]:
    from grammar.xgrammar_backend import apply_bitmask_xgrammar

    torch.set_num_threads(1)
    masks = record_masks()
    num_allowed = np.bitwise_count(masks.numpy().view(np.uint32)).sum(axis=1)
    pools = {"sparse": masks[torch.from_numpy(num_allowed < 1000)],
             "dense": masks[torch.from_numpy(num_allowed >= 1000)], "mixed": masks}
    rng = np.random.default_rng(0)
    results = []
    for shape, pool in pools.items():
        for batch in BATCH_SIZES:
            bitmask = pool[torch.from_numpy(rng.integers(0, len(pool), batch))].contiguous()
            logits = torch.randn(batch, VOCAB_SIZE)
            fresh = lambda: (logits.clone(), bitmask)  # noqa: E731
            row = {"shape": shape, "batch": batch}
            row["xgrammar"] = _median_us(lambda lg, bm: apply_bitmask_xgrammar(lg, bm, None), fresh, repeats) / batch
            row["apply_bitmask"] = _median_us(apply_bitmask, fresh, repeats) / batch
            row["apply+argmax"] = _median_us(lambda lg, bm: (apply_bitmask(lg, bm), lg.argmax(dim=1)), fresh, repeats) / batch
            row["masked_argmax"] = _median_us(masked_argmax, fresh, repeats) / batch
            results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    results = run(args.repeats)
    columns = ["xgrammar", "apply_bitmask", "apply+argmax", "masked_argmax"]
    print("| rows | batch | " + " | ".join(f"{c} (us/row)" for c in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for row in results:
        print(f"| {row['shape']} | {row['batch']} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
