"""Closing early in the scheduler: a scripted "model" writes a loop or runs long under a real
grammar; the engine closes the output, finishes it as STOP and says why. With closing on or off,
an output that ends by itself is the same token for token; a max_tokens below the shortest output
is refused before the first token."""
from __future__ import annotations

import json

import jsonschema
from conftest import make_request, make_scheduler
from grammar_factories import decode, encode, make_backend

from engine.protocol import ErrorKind, FinishReason
from engine.sched.request import RequestStatus
from engine.sched.scheduler_output import ModelRunnerOutput
from engine.structured_output.manager import StructuredOutputManager
from grammar.config import GrammarConfig
from grammar.constraint import Constraint

COMPANY = {"type": "object", "properties": {"company": {"type": "string"}, "id": {"type": "integer"}},
           "required": ["company", "id"]}


def run(schema: dict, script: str, max_tokens: int, close_early: bool | None = None,
        engine_close_early: bool = True, max_model_len: int = 1024):
    """Generate with a runner that samples `script`'s tokens in order (jump-forward off, so the
    script stays aligned with the output); returns (request, final output)."""
    manager = StructuredOutputManager(make_backend(), GrammarConfig(close_early=engine_close_early))
    scheduler = make_scheduler(structured_output_manager=manager, max_model_len=max_model_len)
    constraint = Constraint(kind="json_schema", spec=json.dumps(schema), whitespace="compact",
                            jump_forward=False, close_early=close_early)
    request = make_request(num_tokens=5, max_tokens=max_tokens, constraint=constraint)
    scheduler.add_request(request)
    manager._futures[request.request_id].result(timeout=30)
    script_ids = encode(script)
    final = None
    for _ in range(len(script_ids) + 10):
        so = scheduler.schedule()
        scheduler.get_grammar_bitmask(so)
        sampled = {}
        for req_id in so.num_scheduled_tokens:
            r = scheduler.requests[req_id]
            if r.num_computed_tokens == r.num_tokens:
                sampled[req_id] = [script_ids[r.num_output_tokens]]
        for output in scheduler.update_from_output(so, ModelRunnerOutput(list(so.num_scheduled_tokens), sampled)):
            if output.finish_reason is not None:
                final = output
        if final is not None:
            return request, final
    raise AssertionError("the request did not finish")


def test_a_loop_is_closed_and_reported():
    request, final = run(COMPANY, '{"company":"' + "nordstrom_" * 60, max_tokens=400)
    assert final.finish_reason == FinishReason.STOP and final.closed_early == "repetition"
    assert request.status == RequestStatus.FINISHED_STOPPED
    text = decode([t for t in request.output_token_ids if t not in make_backend().stop_token_ids])
    jsonschema.validate(json.loads(text), COMPANY)
    assert request.num_output_tokens < 100  # ended at the loop, not at max_tokens


def test_the_budget_is_kept_for_the_closing():
    script = '{"company":"' + " ".join(f"word{i}" for i in range(200))
    request, final = run(COMPANY, script, max_tokens=40)
    assert final.closed_early == "budget" and final.finish_reason == FinishReason.STOP
    assert request.num_output_tokens <= 40
    text = decode([t for t in request.output_token_ids if t not in make_backend().stop_token_ids])
    jsonschema.validate(json.loads(text), COMPANY)
    # the context length is a budget too
    request, final = run(COMPANY, script, max_tokens=400, max_model_len=50)
    assert final.closed_early == "budget" and request.num_tokens <= 50


def test_off_it_runs_to_the_length_cap():
    for switch in ({"close_early": False}, {"engine_close_early": False}):
        request, final = run(COMPANY, '{"company":"' + "nordstrom_" * 60, max_tokens=60, **switch)
        assert final.finish_reason == FinishReason.LENGTH and final.closed_early == ""
    # the request's switch wins over the engine's
    _, final = run(COMPANY, '{"company":"' + "nordstrom_" * 60, max_tokens=60, close_early=True,
                   engine_close_early=False)
    assert final.closed_early == "repetition"


def test_a_natural_finish_is_the_same_with_closing_on_and_off():
    script = '{"company":"Acme Widgets","id":42}'
    outputs = [run(COMPANY, script, max_tokens=64, close_early=switch)
               for switch in (True, False)]
    (on, on_final), (off, off_final) = outputs
    assert on.output_token_ids == off.output_token_ids == encode(script)
    assert on_final.finish_reason == off_final.finish_reason == FinishReason.STOP
    assert on_final.closed_early == off_final.closed_early == ""


def test_too_small_a_budget_is_refused_before_the_first_token():
    request, final = run(COMPANY, '{"company":"x","id":1}', max_tokens=3)
    assert final.finish_reason == FinishReason.ERROR and final.error_kind == ErrorKind.CONSTRAINT
    assert "max_tokens is 3" in final.error and "set max_tokens to at least" in final.error
    assert request.num_output_tokens == 0
