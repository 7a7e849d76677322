"""Drafters replayed offline over recorded greedy answers: what each would have had accepted.

`python -m bench.draft_replay [--limit N] [--max-tokens 128]` answers the json-extraction items
once, greedy, without drafts (jump-forward on, as served) and records each step: the token the
model chose and the tokens the grammar forced after it. Then each drafter walks every answer as
the engine would: at a step it proposes a draft (the engine's own Speculator, grammar left out),
the draft is cut before forced text (the grammar cuts it there too), the answer's next tokens say
how much of it is kept, and the walk moves on by that plus one. No timing is involved but the step
costs the pricing reads (`STEP_COST_C1`, a served c=1 run's), so the figures are exact counts:
forward passes per output token, drafted and accepted tokens, and the CPU time of the lookups.
Two oracles bound what drafting could give: perfect drafts, and the answer's next tokens as far
as their text occurs in the prompt.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bench.workloads import extraction_prompt, load_json_extraction
from engine.config import EngineConfig, SpeculativeConfig
from engine.sampling_params import SamplingParams
from engine.sched.request import Request
from engine.spec_decode.speculator import Speculator
from engine.spec_decode.step_cost import StepCostModel
from grammar.constraint import Constraint

# a step's seconds by its rows, served json-extraction at c=1 (docs/benchmarks.md)
STEP_COST_C1 = {1: 0.068, 2: 0.073, 3: 0.075, 4: 0.077, 6: 0.080, 9: 0.094, 16: 0.160}


@dataclass
class Answer:
    prompt_token_ids: list[int]
    first_token_ids: list[int]  # output tokens before the first step (forced at the start)
    steps: list[tuple[int, list[int]]]  # (the model's token, the tokens appended after it without a pass)


def record_answers(llm, items: list[dict], max_tokens: int) -> list[Answer]:
    """Greedy answers without drafts, step by step."""
    engine = llm.engine
    appender = engine.scheduler.output_appender
    take_sampled = appender.take_sampled
    recorded: dict[str, Answer] = {}

    def recording(request, sampled):
        answer = recorded.get(request.request_id)
        if answer is None:
            answer = recorded[request.request_id] = Answer(
                list(request.prompt_token_ids), list(request.output_token_ids), [])
        new_token_ids, num_sampled = take_sampled(request, sampled)
        if new_token_ids:
            answer.steps.append((new_token_ids[0], new_token_ids[1:]))
        return new_token_ids, num_sampled

    appender.take_sampled = recording
    try:
        params = [SamplingParams(temperature=0, max_tokens=max_tokens, speculative=False,
                                 constraint=Constraint(kind="json_schema", spec=json.dumps(item["schema"])))
                  for item in items]
        llm.generate([extraction_prompt(item) for item in items], params)
    finally:
        appender.take_sampled = take_sampled
    return list(recorded.values())


@dataclass
class ReplayCounts:
    num_output_tokens: int = 0
    num_forward_passes: int = 0  # one per step (the prompt's included)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    lookup_s: float = 0.0  # CPU time of proposing (lookup, pricing), all steps
    num_lookups: int = 0
    step_s: float = 0.0  # the steps' estimated seconds (STEP_COST_C1)

    def row(self, name: str, plain: ReplayCounts | None) -> str:
        speedup = f"{plain.step_s / self.step_s:.2f}x" if plain is not None and self.step_s else "-"
        accepted = self.num_accepted_tokens / max(self.num_draft_tokens, 1)
        return (f"{name:>18}  passes/token {self.num_forward_passes / self.num_output_tokens:.3f}  "
                f"drafted {self.num_draft_tokens:5d}  accepted {self.num_accepted_tokens:5d} ({accepted:.0%})  "
                f"lookup {1e6 * self.lookup_s / max(self.num_lookups, 1):.0f} us/call  est. {speedup}")


# a drafter that reads the answer: (the request, the answer's next model tokens up to forced text) -> draft
Oracle = Callable[[Request, list[int]], list[int]]


def perfect_drafts(request: Request, next_token_ids: list[int]) -> list[int]:
    return next_token_ids


def copy_oracle(token_bytes: Sequence[bytes]) -> Oracle:
    """Drafts the answer's next tokens as far as their text occurs somewhere in the prompt: the
    bound of any prompt lookup that always picked the right occurrence."""
    def draft(request: Request, next_token_ids: list[int]) -> list[int]:
        prompt = b"".join(token_bytes[t] for t in request.prompt_token_ids)
        num_tokens = 0
        while (num_tokens < len(next_token_ids)
               and b"".join(token_bytes[t] for t in next_token_ids[:num_tokens + 1]) in prompt):
            num_tokens += 1
        return next_token_ids[:num_tokens]
    return draft


def replay(answers: list[Answer], speculator: Speculator | None, cost: StepCostModel,
           oracle: Oracle | None = None, max_draft_tokens: int = 8) -> ReplayCounts:
    """`speculator` drafts (None: nobody drafts), or `oracle` with drafts of at most `max_draft_tokens`."""
    counts = ReplayCounts()
    for index, answer in enumerate(answers):
        request = Request(f"replay-{index}", answer.prompt_token_ids,
                          SamplingParams(temperature=0, max_tokens=1 << 20, speculative=True))
        request.append_output_token_ids(answer.first_token_ids)
        steps = answer.steps
        counts.num_output_tokens += len(answer.first_token_ids) + sum(1 + len(f) for _, f in steps)
        counts.num_forward_passes += 1  # the prompt's pass samples the first token
        counts.step_s += cost.seconds(min(len(answer.prompt_token_ids), 16))
        request.append_output_token_ids([steps[0][0], *steps[0][1]])
        pending = len(steps[0][1])
        at = 1
        while at < len(steps):
            end = at  # a draft ends before forced text and before the answer's last token
            while end < len(steps) - 1 and not steps[end][1]:
                end += 1
            draft = []
            if oracle is not None:
                draft = oracle(request, [token_id for token_id, _ in steps[at:min(end, at + max_draft_tokens)]])
            elif speculator is not None:
                speculator.begin_step(1)
                start = time.thread_time()
                draft = speculator.propose(request, 1 << 20, 1, stop_at_forced=False)[:end - at]
                counts.lookup_s += time.thread_time() - start
                counts.num_lookups += 1
            num_kept = 0
            while num_kept < len(draft) and draft[num_kept] == steps[at + num_kept][0]:
                num_kept += 1
            if draft and speculator is not None:
                speculator.record(request, len(draft), num_kept)
            if draft:
                counts.num_draft_tokens += len(draft)
                counts.num_accepted_tokens += num_kept
            counts.num_forward_passes += 1
            counts.step_s += cost.seconds(1 + pending + len(draft))
            for token_id, forced in steps[at:at + num_kept + 1]:
                request.append_output_token_ids([token_id, *forced])
            pending = len(steps[min(at + num_kept, len(steps) - 1)][1])
            at += num_kept + 1
    return counts


def step_cost_c1() -> StepCostModel:
    cost = StepCostModel()
    for num_tokens, seconds in STEP_COST_C1.items():
        cost.observe(num_tokens, seconds)
    return cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="json-extraction items (0: all)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    from engine.llm import LLM
    llm = LLM(config=EngineConfig(dtype=args.dtype))
    items = load_json_extraction()
    items = items[:args.limit] if args.limit else items
    start = time.perf_counter()
    answers = record_answers(llm, items, args.max_tokens)
    print(f"{len(answers)} answers recorded in {time.perf_counter() - start:.0f} s")
    backend = llm.engine.structured_output_manager.backend
    cost = step_cost_c1()
    plain = replay(answers, None, cost)
    print(plain.row("no drafts", None))
    base = SpeculativeConfig(enabled=True)
    for name, config in (("tokens", replace(base, draft_by_text=False)), ("tokens + text", base)):
        for priced in (False, True):
            speculator = Speculator(config, backend)
            if priced:
                speculator.step_cost = cost
            print(replay(answers, speculator, cost).row(f"{name}{', priced' if priced else ''}", plain))
    print(replay(answers, None, cost, perfect_drafts).row("perfect drafts", plain))
    print(replay(answers, None, cost, copy_oracle(backend.token_bytes)).row("copy oracle", plain))
    llm.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
