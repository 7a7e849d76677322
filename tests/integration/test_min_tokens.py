"""min_tokens on the real engine: EOS and stop tokens are masked until it is reached (drafted or
not), and a constraint that allows only EOS still ends the output."""
from __future__ import annotations

import pytest

from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint

PROMPT = "Count: one, two, three, four, five, six, seven, eight, nine,"
GREEDY = dict(temperature=0, max_tokens=12)


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "drafted"])
def test_a_stop_token_waits_for_min_tokens(llm, speculative):
    free = llm.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, speculative=speculative))[0]
    stop = free.token_ids[2]  # the greedy third token: a stop token there ends the output at 3 tokens
    first = free.token_ids.index(stop)
    stopped = llm.generate(PROMPT, SamplingParams(**GREEDY, stop_token_ids=[stop], speculative=speculative))[0]
    assert len(stopped.token_ids) == first + 1 and stopped.finish_reason == FinishReason.STOP
    held = llm.generate(PROMPT, SamplingParams(**GREEDY, stop_token_ids=[stop], min_tokens=8,
                                               speculative=speculative))[0]
    assert stop not in held.token_ids[:8] and len(held.token_ids) >= 8
    assert (held.counters.num_draft_tokens > 0) == speculative  # the drafted rows were checked too


def test_a_complete_constraint_ends_before_min_tokens(llm):
    params = SamplingParams(temperature=0, max_tokens=16, min_tokens=10,
                            constraint=Constraint(kind="choice", choices=["yes", "no"]))
    out = llm.generate("Is the sky blue? Answer:", params)[0]
    assert out.text in ("yes", "no") and out.finish_reason == FinishReason.STOP and len(out.token_ids) < 10


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(ValueError, match=r"min_tokens must be in \[0, max_tokens \(4\)\], got 5"):
        SamplingParams(max_tokens=4, min_tokens=5).validate()
