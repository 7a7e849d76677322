"""Speculative decoding in the scheduler: a request with a draft is scheduled for 1 + k tokens, the
rejected tokens' KV is given back (num_computed_tokens), blocks and prefix-cache hashes stay exact,
the grammar moves only over accepted tokens, and drafting switches off where it does not pay.

The model is scripted: each request has a target output, and the model's greedy choice after any
text is the target's next token, so every count below is known in advance.
"""
from __future__ import annotations

from conftest import make_request
from grammar_fakes import scripted_backend
from speculation_fakes import verify_step

from engine.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from engine.sched.request import RequestStatus
from engine.sched.scheduler import Scheduler
from engine.spec_decode.speculator import Speculator
from engine.structured_output.manager import StructuredOutputManager
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

# the prompt holds the span the output copies: 10 11 12 ... 19
PROMPT = [3, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 5, 6]
TARGET = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 7, 7, 7, 2]


def make(k: int = 4, num_blocks: int = 64, enabled: bool = True, manager=None, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=config.pop("budget", 512)),
                     CacheConfig(block_size=4, num_blocks=num_blocks), num_blocks, 1024, manager,
                     Speculator(SpeculativeConfig(enabled=enabled, num_speculative_tokens=k, **config),
                                manager.backend if manager is not None else None))


def scripted(target):
    def next_token(request, token_ids):
        position = len(token_ids) - request.num_prompt_tokens
        return target[position] if position < len(target) else 2
    return next_token


def add(scheduler, request):
    scheduler.add_request(request)
    manager = scheduler.structured_output_manager
    for future in list(manager._futures.values()) if manager is not None else []:
        future.result(timeout=30)  # the grammar compiled before the first schedule


def run(scheduler, requests, target=TARGET, max_steps=100):
    outputs = {r.request_id: [] for r in requests}
    for request in requests:
        add(scheduler, request)
    steps = []
    while scheduler.has_unfinished_requests() and len(steps) < max_steps:
        so = scheduler.schedule()
        steps.append(so)
        for out in verify_step(scheduler, so, scripted(target)):
            outputs[out.request_id] += out.new_token_ids
    return outputs, steps


def test_draft_copied_from_the_prompt_is_accepted_whole_with_a_bonus_token():
    scheduler = make(k=4)
    request = make_request(token_ids=PROMPT, max_tokens=32)
    scheduler.add_request(request)
    verify_step(scheduler, scheduler.schedule(), scripted(TARGET))  # prefill: samples 10
    so = scheduler.schedule()
    assert so.scheduled_spec_decode_tokens == {request.request_id: [11, 12, 13, 14]}  # what followed "10"
    assert so.num_scheduled_tokens == {request.request_id: 5}
    verify_step(scheduler, so, scripted(TARGET))
    assert request.output_token_ids == [10, 11, 12, 13, 14, 15]  # 4 accepted + the bonus token
    assert request.num_computed_tokens == request.num_tokens - 1  # all but the bonus token are in the cache
    assert (request.counters.num_draft_tokens, request.counters.num_accepted_draft_tokens) == (4, 4)


def test_every_output_of_a_drafting_request_carries_its_draft_counts():
    # the front end may end the request on a stop string: it never sees the final output then
    scheduler = make(k=4)
    request = make_request(token_ids=PROMPT, max_tokens=32)
    scheduler.add_request(request)
    (first,) = verify_step(scheduler, scheduler.schedule(), scripted(TARGET))
    assert first.counters.num_draft_tokens == 0
    (second,) = verify_step(scheduler, scheduler.schedule(), scripted(TARGET))
    assert second.finish_reason is None
    assert (second.counters.num_draft_tokens, second.counters.num_accepted_draft_tokens) == (4, 4)


def test_output_is_the_same_with_and_without_drafts_and_takes_fewer_steps():
    with_drafts, steps_on = run(make(k=4), [make_request(token_ids=PROMPT, max_tokens=32)])
    without, steps_off = run(make(enabled=False), [make_request(token_ids=PROMPT, max_tokens=32)])
    assert list(with_drafts.values()) == list(without.values()) == [TARGET]
    assert len(steps_on) < len(steps_off)


def test_rejected_at_the_first_token_gives_back_its_kv_and_blocks():
    scheduler = make(k=4, num_blocks=16)
    target = [10, 40, 41, 42, 43, 2]  # the model leaves the prompt's span at once
    request = make_request(token_ids=PROMPT, max_tokens=32)
    scheduler.add_request(request)
    verify_step(scheduler, scheduler.schedule(), scripted(target))
    so = scheduler.schedule()
    assert so.scheduled_spec_decode_tokens[request.request_id] == [11, 12, 13, 14]
    verify_step(scheduler, so, scripted(target))
    assert request.output_token_ids == [10, 40]
    assert request.num_computed_tokens == request.num_tokens - 1  # the 4 draft positions are discarded
    assert request.counters.num_accepted_draft_tokens == 0
    cached_blocks_hold_only_real_tokens(scheduler, request)
    while scheduler.has_unfinished_requests():
        verify_step(scheduler, scheduler.schedule(), scripted(target))
    assert request.output_token_ids == target
    pool = scheduler.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks - 1  # every block back


def test_partly_accepted_draft_rolls_back_exactly_the_rejected_tokens():
    scheduler = make(k=6)
    target = [10, 11, 12, 50, 51, 2]
    request = make_request(token_ids=PROMPT, max_tokens=32)
    scheduler.add_request(request)
    verify_step(scheduler, scheduler.schedule(), scripted(target))
    so = scheduler.schedule()
    assert len(so.scheduled_spec_decode_tokens[request.request_id]) == 6
    before = request.num_tokens
    verify_step(scheduler, so, scripted(target))
    assert request.output_token_ids == [10, 11, 12, 50]  # 2 accepted, then the model's own token
    assert request.num_computed_tokens == before + 2  # its last token and 2 accepted draft tokens
    cached_blocks_hold_only_real_tokens(scheduler, request)


def cached_blocks_hold_only_real_tokens(scheduler, request):
    """Every hashed block of the request holds the request's own tokens (never a draft)."""
    manager = scheduler.kv_cache_manager
    blocks = manager.req_to_blocks[request.request_id]
    num_hashed = len(manager._req_block_hashes.get(request.request_id, []))
    assert num_hashed <= request.num_tokens // manager.block_size
    for i, block in enumerate(blocks[:num_hashed]):
        assert block.block_key[1] == tuple(request.all_token_ids[i * manager.block_size:(i + 1) * manager.block_size])


def test_draft_stays_within_max_tokens_and_the_token_budget():
    scheduler = make(k=8)
    request = make_request(token_ids=PROMPT, max_tokens=4)
    outputs, steps = run(scheduler, [request])
    assert outputs[request.request_id] == TARGET[:4]
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    # after the first token, 3 may follow: a draft of 2 and the bonus token
    assert [len(d) for so in steps for d in so.scheduled_spec_decode_tokens.values()] == [2]

    scheduler = make(k=8, budget=4)  # the prompt is computed in chunks of 4; then 1 + a draft of 3
    outputs, steps = run(scheduler, [make_request(token_ids=PROMPT, max_tokens=32)])
    assert outputs and all(so.total_num_scheduled_tokens <= 4 for so in steps)
    assert len(steps[4].scheduled_spec_decode_tokens.popitem()[1]) == 3


def test_a_draft_never_preempts_anyone():
    # 4 tokens a block: the prompt and the first token fill 4 blocks, a draft would need a 5th
    scheduler = make(k=4, num_blocks=5)
    request = make_request(token_ids=PROMPT + [20], max_tokens=8)
    scheduler.add_request(request)
    verify_step(scheduler, scheduler.schedule(), scripted([10, 11, 12, 13, 2]))
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    so = scheduler.schedule()
    assert so.scheduled_spec_decode_tokens == {} and so.num_scheduled_tokens == {request.request_id: 1}
    assert scheduler.num_preemptions == 0


def test_grammar_cuts_the_draft_fills_a_row_per_position_and_moves_only_over_accepted_tokens():
    backend = scripted_backend(forbidden={13})
    manager = StructuredOutputManager(backend, GrammarConfig(jump_forward=False, close_early=False))
    scheduler = make(k=6, manager=manager)
    constrained = make_request(token_ids=PROMPT, max_tokens=32, constraint=Constraint(kind="regex", spec=".*"))
    free = make_request(token_ids=[8] + PROMPT, max_tokens=32)
    target = [10, 11, 12, 14, 2]
    for request in (constrained, free):
        add(scheduler, request)
    verify_step(scheduler, scheduler.schedule(), scripted(target))
    grammar = backend.grammars[0]
    assert grammar.accepted == [10]
    so = scheduler.schedule()
    assert so.scheduled_spec_decode_tokens[constrained.request_id] == [11, 12]  # cut before the forbidden 13
    assert so.scheduled_spec_decode_tokens[free.request_id] == [11, 12, 13, 14, 15, 16]
    assert so.structured_output_request_ids == {constrained.request_id: 0}  # rows 0, 1, 2
    fills = grammar.num_fills
    grammar_output = scheduler.get_grammar_bitmask(so)
    assert grammar.num_fills - fills == 3 and grammar.accepted == [10]  # advanced through the draft, rolled back
    assert grammar_output.grammar_bitmask.shape[0] == 3
    verify_step(scheduler, so, scripted(target))
    assert grammar.accepted == [10, 11, 12, 14]  # the accepted draft and the bonus token, nothing else
    assert constrained.output_token_ids == [10, 11, 12, 14]


def test_no_draft_before_text_the_grammar_forces():
    # after 12 the grammar forces 13 14: jump-forward appends them, so the draft stops before 12
    backend = scripted_backend(forcing={12: [13, 14]})
    manager = StructuredOutputManager(backend, GrammarConfig(jump_forward=True, close_early=False))
    request = make_request(token_ids=PROMPT, max_tokens=32, constraint=Constraint(kind="regex", spec=".*"))
    outputs, steps = run(make(k=6, manager=manager), [request])
    assert outputs[request.request_id] == TARGET
    assert steps[1].scheduled_spec_decode_tokens[request.request_id] == [11]
    assert request.counters.num_forced_tokens == 2


def test_requests_with_penalties_or_seeds_do_not_draft_and_a_request_can_opt_out_or_in():
    scheduler = make(k=4)
    speculator = scheduler.speculator
    assert speculator.enabled_for(make_request())
    assert not speculator.enabled_for(make_request(speculative=False))
    sampled = make_request()
    sampled.sampling_params.temperature = 0.7
    assert speculator.enabled_for(sampled)
    sampled.sampling_params.seed = 5  # a seeded request's tokens must not depend on what else runs
    assert not speculator.enabled_for(sampled)
    assert not speculator.enabled_for(make_request(repetition_penalty=1.2))
    assert make(enabled=False).speculator.enabled_for(make_request(speculative=True))
    assert not make(enabled=False).speculator.enabled_for(make_request())


def test_a_think_budget_is_never_drafted_through():
    """xgrammar enforces a token budget where a bitmask is filled: accepting tokens without fills (as a
    draft is cut) takes them past the budget, which verification (a fill per position) then rejects."""
    from grammar_factories import encode, make_backend
    backend = make_backend()
    constraint = Constraint("json_schema", '{"type": "object"}', think_end="</think>", think_budget=6)
    compiled = backend.compile(constraint)
    thinking = encode("The Eiffel Tower is in Paris, France. It is tall.")
    assert len(thinking) > 7
    unfilled = backend.make_grammar(compiled)
    assert unfilled.accept_tokens(thinking)  # no fills: the budget does not hold
    filled, bitmask = backend.make_grammar(compiled), backend.allocate_bitmask(1)
    accepted = 0
    for token_id in thinking:
        filled.fill_bitmask(bitmask, 0)
        if not filled.accept_tokens([token_id]):
            break
        accepted += 1
    assert accepted == 6  # filled before each token: the budget's end marker is forced
    speculator = make(k=4).speculator
    assert not speculator.enabled_for(make_request(constraint=constraint))
    assert speculator.enabled_for(make_request(constraint=Constraint("json_schema", '{"type": "object"}')))


def test_large_batches_do_not_draft():
    scheduler = make(k=4, max_num_running=1)
    asked = []  # a step too large to draft does not even look for one
    propose = scheduler.speculator.propose
    scheduler.speculator.propose = lambda request, *args, **kwargs: asked.append(request) or propose(
        request, *args, **kwargs)
    requests = [make_request(token_ids=PROMPT, max_tokens=32), make_request(token_ids=[9] + PROMPT, max_tokens=32)]
    outputs, steps = run(scheduler, requests)
    assert all(not so.scheduled_spec_decode_tokens for so in steps)
    assert all(out == TARGET for out in outputs.values())
    assert asked == []


def test_rejected_drafts_pause_drafting_for_longer_and_longer():
    scheduler = make(k=2)
    # "10" and then a new token each time: the draft from the last "10" is always wrong
    target = [t for i in range(12) for t in (10, 40 + i)] + [2]
    request = make_request(token_ids=PROMPT, max_tokens=64)
    state = scheduler.speculator.draft_state(request)  # the speculator drops it when the request finishes
    outputs, steps = run(scheduler, [request], target=target)
    assert outputs[request.request_id] == target
    drafted = [bool(so.scheduled_spec_decode_tokens) for so in steps]
    assert sum(drafted) < len(steps) // 2
    assert request.counters.num_accepted_draft_tokens == 0 and state.num_rejected_drafts >= 3


def test_preempted_request_with_drafts_resumes_and_finishes_the_same():
    scheduler = make(k=4, num_blocks=12)
    requests = [make_request(token_ids=PROMPT, max_tokens=14), make_request(token_ids=[9] + PROMPT, max_tokens=14)]
    outputs, steps = run(scheduler, requests)
    assert all(out == TARGET for out in outputs.values())
    assert scheduler.num_preemptions > 0
    pool = scheduler.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks - 1


def test_a_copy_is_drafted_on_from_where_it_was_read_not_from_a_later_match():
    # "13" also occurs later in the prompt, followed by 8: a lookup of the last token alone drafts
    # 8 there, while the copy of 10..16 goes on at 14
    prompt = [3, 10, 11, 12, 13, 14, 15, 16, 5, 13, 8, 6]
    target = [10, 11, 12, 13, 14, 15, 16, 2]
    scheduler = make(k=2, min_ngram=1, max_ngram=1)
    request = make_request(token_ids=prompt, max_tokens=32)
    state = scheduler.speculator.draft_state(request)  # the speculator drops it when the request finishes
    outputs, steps = run(scheduler, [request], target=target)
    assert outputs[request.request_id] == target
    drafts = [so.scheduled_spec_decode_tokens[request.request_id] for so in steps
              if so.scheduled_spec_decode_tokens]
    assert drafts[:2] == [[11, 12], [14, 15]]
    assert request.counters.num_accepted_draft_tokens == 4  # the draft after 16 (5 13) is the one rejected
    assert state.copy_anchor == 7  # accepted drafts copied the prompt up to index 6: matches are read from 7 on
