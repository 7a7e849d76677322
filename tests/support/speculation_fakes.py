"""Stand-ins for the speculative-decoding tests: a grammar with real state (accept, roll back,
forbidden and ending tokens, forced runs) and a scripted model that verifies drafts like the runner."""
from __future__ import annotations

import torch

from engine.sched.scheduler_output import ModelRunnerOutput
from engine.worker.draft_verification import num_accepted
from grammar.backend import CompiledGrammar, Grammar, GrammarBackend

VOCAB_WORDS = 8  # bitmask words: token ids below 256


class StatefulGrammar(Grammar):
    """Allows every token but `forbidden`; `terminal` tokens end the output; after a token in
    `forcing` the grammar forces its run. Keeps the accepted tokens, so rollback is real."""

    def __init__(self, forbidden=(), terminal=(), forcing=None) -> None:
        self.forbidden, self.terminal = set(forbidden), set(terminal)
        self.forcing = dict(forcing or {})
        self.accepted: list[int] = []
        self.num_fills = 0

    def fill_bitmask(self, bitmask, row):
        self.num_fills += 1
        bitmask[row] = -1
        words = bitmask[row].numpy().view("uint32")
        for token_id in self.forbidden:
            words[token_id >> 5] &= ~(1 << (token_id & 31)) & 0xFFFFFFFF

    def accept_tokens(self, token_ids):
        if self.is_terminated() or any(t in self.forbidden for t in token_ids):
            return False
        self.accepted += token_ids
        return True

    def rollback(self, num_tokens):
        if num_tokens:
            del self.accepted[-num_tokens:]

    def is_terminated(self):
        return bool(self.accepted) and self.accepted[-1] in self.terminal

    def jump_forward_token_ids(self):
        forced = self.forcing.get(self.accepted[-1], []) if self.accepted else []
        self.accepted += forced
        return list(forced)


class _Compiled(CompiledGrammar):
    num_bytes = 64


class StatefulBackend(GrammarBackend):
    def __init__(self, **grammar_options) -> None:
        self.grammar_options = grammar_options
        self.grammars: list[StatefulGrammar] = []

    def compile(self, constraint):
        return _Compiled()

    def make_grammar(self, compiled):
        self.grammars.append(StatefulGrammar(**self.grammar_options))
        return self.grammars[-1]

    def allocate_bitmask(self, num_rows):
        return torch.full((num_rows, VOCAB_WORDS), -1, dtype=torch.int32)


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
