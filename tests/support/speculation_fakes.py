"""A scripted model for the speculative-decoding tests, verifying drafts as the runner does."""
from __future__ import annotations

from engine.sched.scheduler_output import ModelRunnerOutput
from engine.worker.draft_verification import num_accepted


def verify_step(scheduler, scheduler_output, next_token):
    """Run one step the way the runner does: `next_token(request, token_ids)` is the model's greedy
    choice after `token_ids`; a draft keeps its agreeing prefix plus the token after it."""
    sampled = {}
    drafts = scheduler_output.scheduled_spec_decode_tokens
    for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        draft = drafts.get(req_id, [])
        if request.num_computed_tokens - len(draft) != request.num_tokens:
            continue  # mid-prompt
        tokens = list(request.all_token_ids)
        chosen = [next_token(request, tokens + draft[:i]) for i in range(len(draft) + 1)]
        num_kept = num_accepted(draft, chosen)
        sampled[req_id] = chosen[:num_kept + 1]
    return scheduler.update_from_output(
        scheduler_output, ModelRunnerOutput(list(scheduler_output.num_scheduled_tokens), sampled))
