"""A tiny random-weight Qwen3 model (tests/support/model_families.py, the default tokenizer) served by the
real engine, with the engine's own bitmasks checked at every sampled step.

The constraint is the one the service builds for the request (service/chat_format.py: the think
markers come from the model's family, qwen3). A random model never ends its thinking by itself, so
the reasoning budget has to: inside the think section every token is allowed, at the budget only
the end marker's tokens are, and after it the rows are exactly those of the answer's grammar
alone (a JSON schema, or the tools' calls); with tool_choice auto the answer is free again.
"""
from __future__ import annotations

import json
from collections import defaultdict

import jsonschema
import msgspec
import numpy as np
import pytest
from google.protobuf import json_format
from model_families import save_family

from engine.config import CacheConfig, EngineConfig
from engine.sampling_params import SamplingParams
from grammar.chat.reasoning import split_reasoning
from grammar.chat.tool_calls import SYNTAXES
from grammar.constraint import Constraint
from service._gen.formwork.v1 import generation_pb2 as pb
from service.chat_format import ChatFormat
from service.grpc.requests import chat_options_from_proto
from service.limits import ServiceLimits

BUDGET = 6  # think tokens
FORECAST = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["unit", "days"], "additionalProperties": False}
ASK = [{"role": "user", "content": "What will the weather be in Lisbon this week?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, model_dir):
    """(Formwork LLM over a random Qwen3 folder, the chat format the service derives for it)."""
    from engine.llm import LLM

    out = tmp_path_factory.mktemp("qwen3")
    save_family("qwen3", out, model_dir)
    llm = LLM(model=str(out), config=EngineConfig(dtype="float32", cache=CacheConfig(num_blocks=64)))
    chat_format = ChatFormat.for_model(str(out), llm.tokenizer.chat_template, ServiceLimits())
    yield llm, chat_format
    llm.shutdown()


class MaskRecorder:
    """Wraps the runner's sample_tokens: per request, (its output token ids so far, the ids its
    bitmask row allows) at every step it is sampled under a grammar."""

    def __init__(self, runner, vocab_size: int) -> None:
        self.runner, self.sample_tokens, self.vocab_size = runner, runner.sample_tokens, vocab_size
        self.steps: dict[str, list[tuple[list[int], set[int]]]] = defaultdict(list)

    def __call__(self, grammar_output):
        parked = self.runner._parked
        if grammar_output is not None:
            rows = grammar_output.structured_output_request_ids
            for req_id in parked.sampling_req_ids:
                if req_id in rows:
                    output_ids = self.runner.input_batch.output_token_ids(req_id).tolist()
                    self.steps[req_id].append((output_ids, allowed(grammar_output.grammar_bitmask[rows[req_id]],
                                                                   self.vocab_size)))
        return self.sample_tokens(grammar_output)


def allowed(row, vocab_size: int) -> set[int]:
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return set(np.flatnonzero(bits).tolist())


def generate(llm, constraint: Constraint, max_tokens: int = 96):
    """(the output, its recorded steps) of one greedy request."""
    runner = llm.engine.runner
    recorder = runner.sample_tokens = MaskRecorder(runner, llm.engine.vocab_size)
    try:
        [output] = llm.generate([{"prompt_token_ids": llm.tokenizer.encode_chat(ASK)}],
                                SamplingParams(max_tokens=max_tokens, temperature=0, constraint=constraint))
    finally:
        runner.sample_tokens = recorder.sample_tokens
    [steps] = recorder.steps.values()
    return output, steps


def planned(chat_format: ChatFormat, constraint: Constraint | None = None, **fields) -> Constraint:
    """The constraint the service sends the engine for a request with `fields` and a think budget."""
    request = json_format.ParseDict({"chat": {"messages": ASK}, "reasoning": {"budget_tokens": BUDGET}, **fields},
                                    pb.GenerateRequest())
    plan = chat_format.plan(chat_options_from_proto(request), constraint, ServiceLimits())
    assert plan.constraint is not None and plan.constraint.think_end == "</think>"
    return plan.constraint


def check_think_steps(llm, steps) -> list[tuple[str, set[int]]]:
    """Asserts the think section's rows (all-ones, then only the end marker at the budget); returns
    (the raw answer text so far, allowed ids) of the steps after the marker."""
    tokenizer, marker = llm.tokenizer, "</think>"
    # free thinking refuses only the ends of the output (so an answer always follows) and the
    # special tokens, which have no text
    xgrammar = llm.engine.structured_output_manager.backend.backends["xgrammar"]  # a think budget's backend
    refusable = set(xgrammar.stop_token_ids) | tokenizer.special_token_ids
    everything = set(range(tokenizer.vocab_size))
    answer_steps = []
    for output_ids, allowed_ids in steps:
        text = tokenizer.decode(output_ids)
        if marker in text:
            answer_steps.append((text.split(marker, 1)[1], allowed_ids))
        elif len(output_ids) < BUDGET:
            assert everything - allowed_ids <= refusable, sorted(everything - allowed_ids)[:10]
        else:  # the budget is spent: only the marker (and what may follow it) is allowed
            written = text[len(tokenizer.decode(output_ids[:BUDGET])):]
            assert marker.startswith(written), text
            pieces = [written + tokenizer.decode([t]) for t in allowed_ids]
            assert pieces and all(marker.startswith(p) or p.startswith(marker) for p in pieces), pieces
    assert answer_steps, "the end marker was never written"
    return answer_steps


def check_answer_rows(llm, answer_steps, answer: Constraint) -> None:
    """After the marker each row is the answer grammar's own row once the answer so far is
    accepted; only the blank line the model may write after the marker is allowed on top."""
    backend = llm.engine.structured_output_manager.backend.backends["xgrammar"]  # auto's choice for these specs
    compiled = backend.compile(answer)
    row = backend.allocate_bitmask(1)
    for raw, allowed_ids in answer_steps:
        grammar = backend.make_grammar(compiled)
        assert grammar.accept_tokens(backend.tokenizer.encode(raw.lstrip("\n"), add_special_tokens=False)), raw
        grammar.fill_bitmask(row, 0)
        expected = allowed(row[0], llm.engine.vocab_size)
        if raw.strip("\n"):
            assert allowed_ids == expected, raw
        else:  # still between the marker and the answer
            assert expected <= allowed_ids
            extra = [llm.tokenizer.decode([t]) for t in allowed_ids - expected]
            assert all(p.startswith("\n") for p in extra), extra[:10]


def test_the_family_defaults_give_qwen3_its_think_markers(qwen3):
    _, chat_format = qwen3
    assert chat_format.reasoning is not None
    assert (chat_format.reasoning.start, chat_format.reasoning.end) == ("<think>", "</think>")
    assert chat_format.tool_syntax == "hermes"


def test_a_json_answer_after_a_budgeted_think_section(qwen3):
    llm, chat_format = qwen3
    schema = Constraint("json_schema", json.dumps(FORECAST))
    output, steps = generate(llm, planned(chat_format, schema))
    answer_steps = check_think_steps(llm, steps)
    check_answer_rows(llm, answer_steps, schema)
    reasoning, answer, ended = split_reasoning(output.text, chat_format.reasoning)
    assert ended and output.finish_reason.name == "STOP", output.text
    jsonschema.validate(json.loads(answer), FORECAST)


def test_required_tool_calls_after_a_budgeted_think_section(qwen3):
    llm, chat_format = qwen3
    tools = [{"name": "forecast", "parameters_json": json.dumps(FORECAST)},
             {"name": "alerts", "parameters_json": json.dumps({"type": "object", "properties": {
                 "level": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["level"],
                 "additionalProperties": False})}]
    constraint = planned(chat_format, tools=tools, tool_choice={"mode": "TOOL_CHOICE_MODE_REQUIRED"},
                         parallel_tool_calls=False)
    output, steps = generate(llm, constraint, max_tokens=128)
    answer_steps = check_think_steps(llm, steps)
    check_answer_rows(llm, answer_steps, msgspec.structs.replace(constraint, think_end="", think_budget=0))
    _, answer, ended = split_reasoning(output.text, chat_format.reasoning)
    content, calls = SYNTAXES[chat_format.tool_syntax].parse(answer)
    assert ended and content == "" and len(calls) == 1, output.text
    [(name, arguments)] = calls
    schemas = {t["name"]: json.loads(t["parameters_json"]) for t in tools}
    jsonschema.validate(json.loads(arguments), schemas[name])


def test_auto_is_free_after_the_think_section_until_a_call_begins(qwen3):
    llm, chat_format = qwen3
    constraint = planned(chat_format, tools=[{"name": "forecast", "parameters_json": json.dumps(FORECAST)}])
    constraint = msgspec.structs.replace(constraint, close_early=False)  # free text to the last token
    output, steps = generate(llm, constraint, max_tokens=24)
    answer_steps = check_think_steps(llm, steps)
    syntax = SYNTAXES[chat_format.tool_syntax]
    everything = set(range(llm.tokenizer.vocab_size))
    for raw, allowed_ids in answer_steps:
        assert syntax.trigger not in raw  # a random model does not call: the answer stays free text
        assert len(everything - allowed_ids) <= 64, raw
    _, answer, ended = split_reasoning(output.text, chat_format.reasoning)
    assert ended and syntax.parse(answer)[1] == []
