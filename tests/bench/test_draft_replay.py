"""bench/draft_replay.py's walk: the engine's drafter over a recorded answer, counted by hand."""
from __future__ import annotations

from bench.draft_replay import Answer, copy_oracle, perfect_drafts, replay, step_cost_c1
from engine.config import SpeculativeConfig
from engine.spec_decode.speculator import Speculator

# the answer copies 10 11 12 13 14 from the prompt, then the grammar forces 7 7 after 14, then 2 ends it
PROMPT = [3, 4, 10, 11, 12, 13, 14, 5, 6]
ANSWER = Answer(PROMPT, [], [(10, []), (11, []), (12, []), (13, []), (14, [7, 7]), (8, []), (2, [])])


def test_without_drafts_every_model_token_is_a_pass():
    counts = replay([ANSWER], None, step_cost_c1())
    assert (counts.num_output_tokens, counts.num_forward_passes, counts.num_draft_tokens) == (9, 7, 0)


def test_a_copy_is_drafted_up_to_the_token_before_forced_text_and_kept():
    speculator = Speculator(SpeculativeConfig(enabled=True, draft_by_text=False))
    counts = replay([ANSWER], speculator, step_cost_c1())
    # pass 1: the prompt (10); pass 2: draft 11 12 13 (cut before 14, which forces 7 7), all kept,
    # and 14 after them; pass 3: draft 7 (what followed the first 7), rejected, and 8; pass 4: 2
    # (never drafted: it ends the answer)
    assert (counts.num_draft_tokens, counts.num_accepted_tokens, counts.num_forward_passes) == (4, 3, 4)
    assert counts.step_s < replay([ANSWER], None, step_cost_c1()).step_s


def test_perfect_drafts_take_every_model_token_up_to_forced_text_and_the_last():
    counts = replay([ANSWER], None, step_cost_c1(), perfect_drafts)
    # pass 1: the prompt (10); pass 2: 11 12 13 and 14; pass 3: 8 and 2
    assert (counts.num_draft_tokens, counts.num_accepted_tokens, counts.num_forward_passes) == (4, 4, 3)


def test_the_copy_oracle_drafts_only_text_the_prompt_holds():
    token_bytes = [bytes([65 + i]) for i in range(16)]  # token i is one letter
    counts = replay([ANSWER], None, step_cost_c1(), copy_oracle(token_bytes))
    # 11 12 13 are in the prompt, 8 is not: passes 1 (prompt), 2 (11 12 13 + 14), 3 (8), 4 (2)
    assert (counts.num_draft_tokens, counts.num_accepted_tokens, counts.num_forward_passes) == (3, 3, 4)
