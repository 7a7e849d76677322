"""`python -m bench.quantization_agreement`: how often int8 weights pick the unquantized model's token.

The unquantized model answers each held prompt greedily (32 tokens); then the quantized model is
shown the same prompt and each prefix of that answer, and picks its own greedy next token
(teacher forcing: one early disagreement does not make every later position differ). Agreement is
the share of positions where the two choose the same token. Then the JSON-extraction items with
their schemas as constraints: the share of quantized answers that parse and validate (structured
output must stay 100% valid) and their field accuracy beside the unquantized model's.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from bench.prompts import chat_prompts
from bench.structured import score
from bench.workloads import extraction_prompt, load_json_extraction


def greedy_answers(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, speculative=False)
    return [list(o.token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def teacher_forced_choices(llm, prompts: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
    """For every prompt and every prefix answer[:i], the model's greedy token after prompt + answer[:i]."""
    from engine.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, speculative=False)
    requests = [{"prompt_token_ids": p + a[:i]} for p, a in zip(prompts, answers) for i in range(len(a))]
    picked = [o.token_ids[0] for o in llm.generate(requests, params)]
    choices, start = [], 0
    for a in answers:
        choices.append(picked[start:start + len(a)])
        start += len(a)
    return choices


def agreement(reference: list[list[int]], choices: list[list[int]]) -> float:
    """Share of positions where the two token lists agree."""
    pairs = [(r, c) for ref, chosen in zip(reference, choices) for r, c in zip(ref, chosen)]
    return sum(r == c for r, c in pairs) / max(1, len(pairs))


def structured_answers(llm, items: list[dict], max_tokens: int) -> tuple[list[str], dict[str, int]]:
    """The constrained answers' texts and how many ended for each reason."""
    from collections import Counter

    from engine.protocol import FinishReason
    from engine.sampling_params import SamplingParams
    from grammar.constraint import Constraint
    params = [SamplingParams(max_tokens=max_tokens, temperature=0,
                             constraint=Constraint("json_schema", json.dumps(item["schema"]))) for item in items]
    outputs = llm.generate([extraction_prompt(item) for item in items], params)
    ends = Counter("unfinished" if o.finish_reason is None else FinishReason(o.finish_reason).name for o in outputs)
    return [o.text for o in outputs], dict(ends)


def main(argv: list[str] | None = None) -> None:
    from engine.args import add_engine_args, engine_config_from_args
    from engine.llm import LLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(parser)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-structured", type=int, default=16, help="JSON-extraction items (0: skip)")
    args = parser.parse_args(argv)
    config = engine_config_from_args(args)
    int8 = replace(config, quantization=config.quantization or "int8")
    plain = replace(config, quantization=None, quantize_lm_head=False)
    items = load_json_extraction()[:args.num_structured]

    llm = LLM(config=plain)
    prompts = [llm.encode_prompt(p) for p in chat_prompts(args.num_prompts)]
    reference = greedy_answers(llm, prompts, args.max_tokens)
    plain_texts, plain_ends = structured_answers(llm, items, 256) if items else ([], {})
    llm.shutdown()

    llm = LLM(config=int8)
    choices = teacher_forced_choices(llm, prompts, reference)
    free_running = greedy_answers(llm, prompts, args.max_tokens)
    int8_texts, int8_ends = structured_answers(llm, items, 256) if items else ([], {})
    llm.shutdown()

    label = int8.quantization + (" + lm_head" if int8.quantize_lm_head else "")
    print(f"{label}: greedy token agreement with the unquantized model over {args.num_prompts} prompts x "
          f"{args.max_tokens} tokens: {agreement(reference, choices):.1%} teacher-forced, "
          f"{agreement(reference, free_running):.1%} free-running")
    if items:
        schemas = [item["schema"] for item in items]
        for name, texts, ends in (("unquantized", plain_texts, plain_ends), (label, int8_texts, int8_ends)):
            valid, accuracy = score(items, texts, schemas)
            print(f"  structured ({name}): {valid}/{len(items)} valid, field accuracy {accuracy:.3f}, ended: {ends}")


if __name__ == "__main__":
    main()
