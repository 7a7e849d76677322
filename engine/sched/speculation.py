"""Which requests draft this step, their drafts, and what became of them.

A draft is verified in the same forward pass as the request's own next token: the request is
scheduled for 1 + k tokens, and the runner keeps the prefix of the draft that its sampled (or
greedy) tokens agree with, plus the token after it (engine/worker/draft_verification.py): greedy,
the output is token for token what decoding without drafts gives; sampled, it has the same
distribution. Requests with penalties do not draft (a penalty at a draft position would have to
count the draft tokens before it), nor do seeded sampled requests (a seed gives the same tokens
whatever else runs, and drafting depends on what else runs).

The draft is cut (engine/sched/ngram_drafter.py) so that every kept draft token is one the
engine could have sampled in a step of its own: at the first token the grammar rejects, before a
token that ends the output, and (jump-forward on) before a token after which the grammar forces
text, which jump-forward appends instead of the model's tokens.

Drafting pays where a step is bound by reading the weights (few requests) and the drafts are
accepted: it stops while more than `max_num_running` requests run, and a request whose drafts
are all rejected drafts less and less often (a pause that doubles, up to `MAX_PAUSE_STEPS`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.sched.ngram_drafter import cut_by_grammar, find_ngram_draft

if TYPE_CHECKING:
    from engine.config import SpeculativeConfig
    from engine.sched.request import Request

MAX_PAUSE_STEPS = 32


class Speculator:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def enabled_for(self, request: Request) -> bool:
        params = request.sampling_params
        wanted = self.config.enabled if params.speculative is None else params.speculative
        return (wanted and (params.greedy or params.seed is None) and params.repetition_penalty == 1.0
                and not params.frequency_penalty and not params.presence_penalty)

    def propose(self, request: Request, max_tokens: int, num_running: int, stop_at_forced: bool) -> list[int]:
        """A draft of at most `max_tokens` tokens to verify after the request's tokens ([] if it
        should not draft now). `stop_at_forced`: jump-forward is on for the request. The
        request's grammar is left as it was."""
        config = self.config
        if max_tokens < 1 or num_running > config.max_num_running or not self.enabled_for(request):
            return []
        if request.draft_pause_steps:
            request.draft_pause_steps -= 1
            return []
        draft = find_ngram_draft(request.all_token_ids, config.min_ngram, config.max_ngram,
                                 min(max_tokens, config.num_speculative_tokens))
        if draft and request.grammar is not None:
            draft = cut_by_grammar(request.grammar, draft, stop_before_forced=stop_at_forced)
        return draft

    def record(self, request: Request, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count a verified draft; a draft rejected at its first token pauses the request's drafting."""
        request.num_draft_tokens += num_draft_tokens
        request.num_accepted_draft_tokens += num_accepted_tokens
        if num_accepted_tokens:
            request.num_rejected_drafts = 0
            return
        request.num_rejected_drafts += 1
        request.draft_pause_steps = min(1 << min(request.num_rejected_drafts - 1, 5), MAX_PAUSE_STEPS)
