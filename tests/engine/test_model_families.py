"""Every supported family against transformers, on tiny random models (tests/support/model_families.py), in float32.

One engine per family serves a batch of mixed lengths through the paged cache with prefix caching
(one prompt extends an earlier one), chunked prefill (a step budget smaller than the longest prompt)
and decodes past the sliding window: greedy tokens over 32 steps equal transformers' (a full forward
per step, no cache), and every step's logits agree to 1e-4. Constrained generation works on each.
"""
from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest
import torch
from model_families import FAMILIES, WINDOW, WINDOWED, save_family

from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint

NUM_STEPS = 32
STEP_BUDGET = 48  # tokens per step: the 90-token prompt is prefilled in chunks


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, model_dir):
    """(name, transformers model, Formwork LLM over the saved folder)."""
    from engine.llm import LLM

    out = tmp_path_factory.mktemp(request.param)
    hf_model = save_family(request.param, out, model_dir)
    llm = LLM(model=str(out), config=EngineConfig(
        dtype="float32", scheduler=SchedulerConfig(max_num_batched_tokens=STEP_BUDGET),
        cache=CacheConfig(num_blocks=128)))
    yield request.param, hf_model, llm
    llm.shutdown()


class LogitsRecorder:
    """Wraps the runner's sample_tokens and keeps, per request, the logits of every step it samples."""

    def __init__(self, runner):
        self.runner, self.sample_tokens = runner, runner.sample_tokens
        self.logits: dict[str, list[torch.Tensor]] = defaultdict(list)

    def __call__(self, grammar_output):
        parked = self.runner._parked
        for req_id, row in zip(parked.sampling_req_ids, parked.logits):
            self.logits[req_id].append(row.clone())
        return self.sample_tokens(grammar_output)


def greedy_reference(hf_model, prompt: list[int], num_steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and each step's logits, recomputing the whole sequence every step."""
    ids, logits = list(prompt), []
    with torch.inference_mode():
        for _ in range(num_steps):
            row = hf_model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float()
            logits.append(row)
            ids.append(int(row.argmax()))
    return ids[len(prompt):], logits


def prompts() -> tuple[list[int], list[list[int]]]:
    """A first prompt, then a batch of mixed lengths whose first member extends it by 30 tokens."""
    rng = random.Random(0)
    tokens = [rng.randrange(3, 49152) for _ in range(300)]
    first = tokens[:64]
    return first, [first + tokens[64:94], tokens[100:105], tokens[110:200], tokens[200:201]]


def test_greedy_tokens_and_logits_match_transformers(family):
    name, hf_model, llm = family
    runner = llm.engine.runner
    recorder = runner.sample_tokens = LogitsRecorder(runner)
    # one logits row a step to compare: no draft rows (tests/integration/test_speculative_model.py checks drafts)
    params = SamplingParams(max_tokens=NUM_STEPS, temperature=0, ignore_eos=True, speculative=False)
    first, batch = prompts()
    try:
        outputs = llm.generate([{"prompt_token_ids": first}], params)
        outputs += llm.generate([{"prompt_token_ids": p} for p in batch], params)
    finally:
        del runner.sample_tokens
    assert outputs[1].counters.num_cached_tokens >= 48, "the extended prompt should reuse the first one's blocks"
    if name in WINDOWED:
        assert len(batch[2]) + NUM_STEPS > 4 * WINDOW  # attends well past the window
    for prompt, out in zip([first, *batch], outputs):
        ref_tokens, ref_logits = greedy_reference(hf_model, prompt, NUM_STEPS)
        assert out.token_ids == ref_tokens, f"{name}: prompt of {len(prompt)} tokens"
        ours = torch.stack(recorder.logits[out.request_id])
        torch.testing.assert_close(ours, torch.stack(ref_logits), atol=1e-4, rtol=1e-4)


def test_constrained_generation(family):
    name, _, llm = family
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer", "count"], "additionalProperties": False}
    constraints = [Constraint(kind="json_schema", spec=json.dumps(schema)), Constraint(kind="regex", spec=r"[a-c]{3}-\d")]
    outs = llm.generate(["Answer as JSON.", "A code:"],
                        [SamplingParams(max_tokens=48, temperature=0, constraint=c) for c in constraints])
    answer = json.loads(outs[0].text)
    assert answer["answer"] in ("yes", "no", "maybe") and 0 <= answer["count"] <= 9, (name, outs[0].text)
    assert len(outs[1].text) == 5 and outs[1].text[3] == "-", (name, outs[1].text)
