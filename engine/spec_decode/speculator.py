"""Which requests draft this step, how many tokens, and what became of their drafts.

A draft is verified in the same forward pass as the request's own next token: the request is
scheduled for 1 + k tokens, and the runner keeps the prefix of the draft that its sampled (or
greedy) tokens agree with, plus the token after it (engine/worker/draft_verification.py): greedy,
the output is token for token what decoding without drafts gives; sampled, it has the same
distribution. Requests with penalties do not draft (a penalty at a draft position would have to
count the draft tokens before it), nor do seeded sampled requests (a seed gives the same tokens
whatever else runs, and drafting depends on what else runs).

Where a draft is read: a copy that is still going on goes on from there, by tokens (the text's
last token is the one before where its previous draft was read, that many tokens back) or by text
(the output's last bytes end in the prompt's text just after where the output last copied to);
otherwise the tokens after an earlier occurrence of the text's last n tokens; when there is none,
the prompt text after an occurrence of the output's last bytes, tokenized
(engine/spec_decode/text_drafter.py: it finds the copies whose tokens differ from the prompt's, `"Ann`
where the prompt has ` Ann`). A span being copied is the likeliest source of what comes next,
and the latest occurrence of a short n-gram is often somewhere else (a key of the schema, the
output itself). For the same reason a fresh match is taken, among its occurrences, from the
prompt at or after where the output last copied from (extraction reads its text in order), and
the latest occurrence only when there is none there. Continued copies keep acceptance rates of
their own (`COPY_CONTINUED`, `TEXT_CONTINUED`), so they are priced apart from fresh matches.
Replayed over greedy json-extraction answers (bench/draft_replay.py), the token lookup finds most
of what is accepted; text adds the few percent the tokens cannot reach (docs/benchmarks.md).

The draft is cut (engine/spec_decode/ngram_drafter.py) so that every kept draft token is one the
engine could have sampled in a step of its own: at the first token the grammar rejects, before a
token that ends the output, and (jump-forward on) before a token after which the grammar forces
text, which jump-forward appends instead of the model's tokens.

How long a draft is, is a bet priced per step. Each draft token is accepted with the request's
acceptance rate (measured on its recent drafts, starting from the rate of all recent drafts that
followed an n-gram match of the same length, a text match, or continued a copy) given the ones
before it were, so k tokens are worth a(1 + a + ... + a^(k-1)) tokens; they cost what k more
rows add to the step (engine/spec_decode/step_cost.py, measured: on CPU in the time the step's
threads ran, so that other processes on the machine do not price drafts out). The speculator
picks the k that gives the step the most tokens per second, counting the rows and tokens already
planned for it: where rows are nearly free (few requests) a likely copy drafts long, at a batch
where every row costs its share it drafts nothing. A request whose drafts are all rejected also pauses
(a pause that doubles, up to `MAX_PAUSE_STEPS`), and nobody drafts while more than
`max_num_running` requests run.

What the speculator knows of a request's drafts (its acceptance rate, its pause, where its copy
goes on) is a DraftState it keeps by request id until the scheduler says the request finished.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.sched.drafter import Drafter
from engine.spec_decode.acceptance_rate import AcceptanceRate
from engine.spec_decode.draft_state import DraftState
from engine.spec_decode.ngram_drafter import continued_copy, cut_by_grammar, find_ngram_match
from engine.spec_decode.step_cost import StepCostModel
from engine.spec_decode.text_drafter import PromptText, TextDrafter, TextMatch

if TYPE_CHECKING:
    from engine.config import SpeculativeConfig
    from engine.sched.request import Request
    from grammar.backend import GrammarBackend

MAX_PAUSE_STEPS = 32
# acceptance keys besides the n-gram lengths (>= 1): drafts that continue a token copy, that
# continue a text copy, and fresh text matches
COPY_CONTINUED = 0
TEXT_CONTINUED = -1
TEXT_MATCHED = -2
_TEXT_STEP_BYTES = 24  # a text match ending this close after where the output last copied to goes on copying
_FIRST_ACCEPTANCE = 0.5  # the prior rate before any draft was verified
_GLOBAL_DECAY = 0.98  # the rates of all requests' drafts remember about the last 50


class Speculator(Drafter):
    def __init__(self, config: SpeculativeConfig, backend: GrammarBackend | None = None) -> None:
        """`backend`: the grammar backend, whose vocabulary bytes and tokenizer draft by text
        (None, or a backend that cannot encode text mid-output: drafts by tokens only)."""
        self.config = config
        self.text_drafter = _text_drafter(config, backend)
        self.step_cost = StepCostModel()
        # acceptance key (n-gram length, or a COPY_/TEXT_ key above) -> rate of every request's
        # drafts found that way: a request's prior
        self.acceptance: dict[int, AcceptanceRate] = {}
        self._num_rows = 0  # rows (tokens) planned for this step so far
        self._num_yield = 0.0  # tokens this step is expected to give, so far
        self._states: dict[str, DraftState] = {}  # req_id -> its drafts so far, from its first proposal on

    def draft_state(self, request: Request) -> DraftState:
        """The request's draft state (a fresh one on first use)."""
        state = self._states.get(request.request_id)
        if state is None:
            state = self._states[request.request_id] = DraftState()
        return state

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def enabled_for(self, request: Request) -> bool:
        params = request.sampling_params
        wanted = self.config.enabled if params.speculative is None else params.speculative
        # a think budget is a token budget in xgrammar's matcher, which accepts tokens past it unless
        # a bitmask was filled before each: a draft cut without fills would not be the one verified
        think_budget = params.constraint is not None and params.constraint.think_budget > 0
        return (wanted and not think_budget and (params.greedy or params.seed is None)
                and params.repetition_penalty == 1.0 and not params.frequency_penalty and not params.presence_penalty)

    def begin_step(self, num_running: int) -> bool:
        """A new plan: each running request computes about one token and gives about one. False
        when the step is too large for anyone to draft (the scheduler then asks no one)."""
        self._num_rows = num_running
        self._num_yield = float(num_running)
        return num_running <= self.config.max_num_running

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """What a step of `num_tokens` tokens took, launch to outputs (the cost of rows)."""
        self.step_cost.observe(num_tokens, seconds)

    def propose(self, request: Request, max_tokens: int, num_running: int, stop_at_forced: bool) -> list[int]:
        config = self.config
        if max_tokens < 1 or num_running > config.max_num_running or not self.enabled_for(request):
            return []
        state = self.draft_state(request)
        if state.draft_pause_steps:
            state.draft_pause_steps -= 1
            return []
        source = self.find_source(request, min(max_tokens, config.num_speculative_tokens))
        if source is None:
            return []
        rate = state.draft_acceptance.rate(self._acceptance(source.key).rate(_FIRST_ACCEPTANCE))
        num_wanted = self.draft_length(rate, len(source.token_ids))
        if not num_wanted:
            state.draft_acceptance.add(0, 0)  # its old outcomes fade: it tries again later
            return []
        draft = source.token_ids[:num_wanted]
        if request.grammar is not None:
            draft = cut_by_grammar(request.grammar, draft, stop_before_forced=stop_at_forced)
        if draft:
            state.draft_ngram = source.key
            state.copy_offset = source.begin - request.num_tokens if source.begin >= 0 else 0
            state.draft_begin = source.begin
            state.draft_text_ends = source.text_ends
            self._num_rows += len(draft)
            self._num_yield += _expected_tokens(rate, len(draft))
        return draft

    def find_source(self, request: Request, max_tokens: int) -> DraftSource | None:
        """Where the next draft is read: a copy that is still going on, by tokens (its last tokens
        are the ones before where its previous draft was read) or by text (the output's end
        matches the prompt's text just after where it last copied to); else an n-gram match of
        its last tokens in the prompt and output; else a match of its last bytes in the prompt's
        text (engine/spec_decode/text_drafter.py), which finds copies whose tokens differ from the
        prompt's. None when nothing matches."""
        config = self.config
        state = self.draft_state(request)
        tokens = request.all_token_ids
        if state.copy_offset:
            begin = continued_copy(tokens, state.copy_offset, config.copy_check_tokens)
            if begin >= 0:
                return DraftSource(COPY_CONTINUED, tokens[begin:begin + max_tokens], begin)
        text_drafter = self.text_drafter
        if text_drafter is not None and state.text_anchor:
            prompt_text = self._prompt_text(request, text_drafter)
            match = text_drafter.find_continued(text_drafter.output_tail(tokens, request.num_prompt_tokens),
                                                prompt_text, state.text_anchor, _TEXT_STEP_BYTES)
            source = _text_source(text_drafter, prompt_text, match, TEXT_CONTINUED, max_tokens)
            if source is not None:
                return source
        ngram, begin = find_ngram_match(tokens, config.min_ngram, config.max_ngram, state.copy_anchor,
                                        request.num_prompt_tokens)
        if begin >= 0:
            return DraftSource(ngram, tokens[begin:begin + max_tokens], begin)
        if text_drafter is not None:
            prompt_text = self._prompt_text(request, text_drafter)
            match = text_drafter.find(text_drafter.output_tail(tokens, request.num_prompt_tokens), prompt_text,
                                      state.text_anchor)
            return _text_source(text_drafter, prompt_text, match, TEXT_MATCHED, max_tokens)
        return None

    def prompt_text(self, request: Request) -> PromptText | None:
        """The request's prompt as bytes, joined on first use and kept in its draft state; None
        when the speculator does not draft by text."""
        return self._prompt_text(request, self.text_drafter) if self.text_drafter is not None else None

    def _prompt_text(self, request: Request, text_drafter: TextDrafter) -> PromptText:
        state = self.draft_state(request)
        if state.prompt_text is None:
            state.prompt_text = text_drafter.prompt_text(request.prompt_token_ids)
        return state.prompt_text

    def _acceptance(self, ngram: int) -> AcceptanceRate:
        rate = self.acceptance.get(ngram)
        if rate is None:
            rate = self.acceptance[ngram] = AcceptanceRate(decay=_GLOBAL_DECAY)
        return rate

    def draft_length(self, rate: float, max_tokens: int) -> int:
        """The draft length (0 to `max_tokens`) that gives this step the most tokens per second,
        with each draft token accepted at `rate` after the ones before it."""
        cost = self.step_cost
        if not cost.measured:
            return max_tokens  # nothing measured yet: the first steps measure
        best_length, best_rate = 0, self._num_yield / max(cost.seconds(self._num_rows), 1e-9)
        gain, chance = 0.0, 1.0
        for length in range(1, max_tokens + 1):
            chance *= rate
            gain += chance
            tokens_per_s = (self._num_yield + gain) / max(cost.seconds(self._num_rows + length), 1e-9)
            if tokens_per_s > best_rate:
                best_length, best_rate = length, tokens_per_s
        return best_length

    def record(self, request: Request, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Learn from a verified draft; a draft rejected at its first token pauses the request's drafting."""
        state = self.draft_state(request)
        state.draft_acceptance.add(num_draft_tokens, num_accepted_tokens)
        self._acceptance(state.draft_ngram).add(num_draft_tokens, num_accepted_tokens)
        if num_accepted_tokens:
            self._move_anchors(request, state, num_accepted_tokens)
            state.num_rejected_drafts = 0
            return
        state.num_rejected_drafts += 1
        state.draft_pause_steps = min(1 << min(state.num_rejected_drafts - 1, 5), MAX_PAUSE_STEPS)

    def _move_anchors(self, request: Request, state: DraftState, num_accepted_tokens: int) -> None:
        """The output copied the prompt up to the end of the accepted draft tokens: both anchors
        (prompt tokens, prompt bytes) move there, whichever drafter read the draft."""
        prompt_text = self.prompt_text(request)
        if state.draft_text_ends:
            state.text_anchor = state.draft_text_ends[num_accepted_tokens - 1]
            if prompt_text is not None:
                state.copy_anchor = prompt_text.num_tokens_within(state.text_anchor)
        elif state.draft_begin < request.num_prompt_tokens:
            state.copy_anchor = state.draft_begin + num_accepted_tokens
            if prompt_text is not None:
                state.text_anchor = prompt_text.byte_end(min(state.copy_anchor, request.num_prompt_tokens))


@dataclass(frozen=True)
class DraftSource:
    """A draft found for a request, before it is priced and cut by the grammar."""

    key: int  # the acceptance rate it is priced by: n-gram length, COPY_CONTINUED or a TEXT_ key
    token_ids: list[int]
    begin: int = -1  # where in the request's tokens it was read (-1: from the prompt's text)
    text_ends: list[int] = field(default_factory=list)  # read from text: each token's end in the prompt's bytes


def _text_source(text_drafter: TextDrafter, prompt_text: PromptText, match: TextMatch | None, key: int,
                 max_tokens: int) -> DraftSource | None:
    """The draft read from the prompt's text at `match` (None: no match, or no whole token there)."""
    if match is None:
        return None
    token_ids, ends = text_drafter.draft_at(prompt_text, match.begin, max_tokens)
    if not token_ids:
        return None
    return DraftSource(key, token_ids, text_ends=[match.begin + end for end in ends])


def _text_drafter(config: SpeculativeConfig, backend: GrammarBackend | None) -> TextDrafter | None:
    if not config.draft_by_text or backend is None or backend.token_bytes is None:
        return None
    encode = backend.text_encoder()
    if encode is None:
        return None
    return TextDrafter(backend.token_bytes, encode, config.min_text_match, config.max_text_match)


def _expected_tokens(rate: float, num_draft_tokens: int) -> float:
    """Accepted tokens expected of a draft: rate + rate^2 + ... + rate^k."""
    return sum(rate ** i for i in range(1, num_draft_tokens + 1))
