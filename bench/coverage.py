"""`formwork bench coverage`: which real-world schemas compile, and are the outputs valid?

For each schema: compiled or rejected (with the reason), and for compiled ones whether the output
finished because the grammar completed and validates with jsonschema (Draft 2020-12), or hit
max_tokens (length-capped, never counted as success). `invalid` must be 0. Valid outputs that the
engine closed early (Constraint.close_early: the budget ran low, or the output looped) are counted
apart too; by default the sample runs twice, with closing early on and off.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.datasets import SAMPLE_MAX_BYTES, SUBSETS, jsonschemabench_dir

PROMPT = "Produce one realistic example JSON document for the schema you are given. Output only the JSON."


def load_schemas(subsets: list[str], limit: int, max_bytes: int = SAMPLE_MAX_BYTES,
                 data: Path | str | None = None) -> list[tuple[str, str, dict]]:
    """The first `limit` schemas (under max_bytes) of each subset: (subset, id, schema).

    From the sample the project carries, or from `data` (a folder of <Subset>.jsonl, e.g. the full set)."""
    folder = jsonschemabench_dir(data)
    out = []
    for subset in subsets:
        taken = 0
        with open(folder / f"{subset}.jsonl", encoding="utf-8") as f:
            for line in f:
                item = json.loads(line)
                if len(json.dumps(item["schema"])) > max_bytes:
                    continue
                out.append((subset, item["id"], item["schema"]))
                taken += 1
                if taken == limit:
                    break
    return out


def rejection_reason(error: str) -> str:
    m = re.match(r'unsupported keywords? ("[^"]+")', error)
    if m:
        return f"unsupported {m.group(1)}"
    for needle, reason in (("exceeded", "compile time limit"), ("limit", "size/depth limit"),
                           ("does not compile", "compile error"),
                           ("shortest output", "max_tokens below the shortest output")):
        if needle in error:
            return reason
    return error.split(":")[0][:60]


@dataclass
class SubsetResult:
    total: int = 0
    compiled: int = 0
    rejected: Counter = field(default_factory=Counter)
    valid: int = 0
    closed_early: Counter = field(default_factory=Counter)  # reason -> valid outputs the engine closed
    length_capped: int = 0
    invalid: list[str] = field(default_factory=list)


def run_coverage(llm, schemas: list[tuple[str, str, dict]], max_tokens: int,
                 close_early: bool | None = None) -> dict[str, SubsetResult]:
    """`close_early`: the constraints' switch (None: the engine's default)."""
    import jsonschema

    from engine.protocol import FinishReason
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint

    prompts = [[{"role": "system", "content": PROMPT}, {"role": "user", "content": f"Schema id: {sid}"}]
               for _, sid, _ in schemas]
    params = [SamplingParams(temperature=0, max_tokens=max_tokens,
                             constraint=Constraint(kind="json_schema", spec=json.dumps(schema),
                                                   close_early=close_early))
              for _, _, schema in schemas]
    outputs = llm.generate(prompts, params)
    results: dict[str, SubsetResult] = defaultdict(SubsetResult)
    for (subset, sid, schema), out in zip(schemas, outputs):
        r = results[subset]
        r.total += 1
        if out.finish_reason == FinishReason.ERROR and out.num_output_tokens == 0:
            r.rejected[rejection_reason(out.error or "")] += 1
            continue
        r.compiled += 1
        if out.finish_reason == FinishReason.LENGTH:
            r.length_capped += 1
            continue
        try:
            jsonschema.Draft202012Validator(schema).validate(json.loads(out.text))
        except (ValueError, jsonschema.ValidationError) as e:
            r.invalid.append(f"{sid}: {type(e).__name__}: {str(e)[:200]} | output {out.text[:200]!r}")
            continue
        if out.finish_reason != FinishReason.STOP:
            r.invalid.append(f"{sid}: finished {out.finish_reason} {out.error}")
            continue
        r.valid += 1
        if out.closed_early:
            r.closed_early[out.closed_early] += 1
    return dict(results)


def print_report(results: dict[str, SubsetResult], title: str = "") -> None:
    if title:
        print(title)
    print(f"{'subset':<16} {'total':>5} {'compiled':>8} {'rejected':>8} {'valid':>5} {'closed':>6} {'capped':>6} "
          f"{'invalid':>7}")
    for subset, r in results.items():
        print(f"{subset:<16} {r.total:>5} {r.compiled:>8} {sum(r.rejected.values()):>8} {r.valid:>5} "
              f"{sum(r.closed_early.values()):>6} {r.length_capped:>6} {len(r.invalid):>7}")
        for reason, count in r.rejected.most_common():
            print(f"    rejected {count} x {reason}")
        if r.closed_early:
            print("    closed early: " + ", ".join(f"{count} x {reason}" for reason, count in r.closed_early.most_common()))
        for line in r.invalid:
            print(f"    INVALID {line}")


def main(args, engine_config) -> int:
    from engine.llm import LLM
    subsets = args.subset or list(SUBSETS)
    schemas = load_schemas(subsets, args.limit, data=args.data)
    runs = {"on": [True], "off": [False], "both": [True, False]}[args.close_early]
    llm = LLM(config=engine_config)
    failed = False
    try:
        for close_early in runs:
            results = run_coverage(llm, schemas, args.max_tokens, close_early=close_early)
            print_report(results, f"closing early {'on' if close_early else 'off'}, max_tokens {args.max_tokens}:")
            failed |= any(r.invalid for r in results.values())
    finally:
        llm.shutdown()
    return 1 if failed else 0
