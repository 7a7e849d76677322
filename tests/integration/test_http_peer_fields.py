"""Fields the SGLang and vLLM OpenAI-server tests send, with the openai SDK against a live server:
SGLang's constraint fields, min_tokens, continuous usage, chat_template_kwargs, and a field that
names a constraint Formwork does not read (a 400 naming it, never free text)."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from live_server import PERSON_SCHEMA

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ASK_PERSON = [{"role": "user", "content": "Invent a person. Answer in JSON."}]


@pytest.fixture(scope="module")
def client(default_server):
    with openai.OpenAI(base_url=f"{default_server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def ask(client, extra_body: dict, messages=ASK_PERSON, max_tokens=48, **fields):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,
                                          extra_body=extra_body, **fields)


def test_sglang_regex_ebnf_and_json_schema_constrain_the_answer(client):
    digits = ask(client, {"regex": "[0-9]{3}-[0-9]{4}"}, [{"role": "user", "content": "A phone number:"}])
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", digits.choices[0].message.content)
    yes_no = ask(client, {"ebnf": 'root ::= "yes" | "no"'}, [{"role": "user", "content": "Is the sky blue?"}])
    assert yes_no.choices[0].message.content in ("yes", "no")
    person = ask(client, {"json_schema": json.dumps(PERSON_SCHEMA)})  # SGLang sends the schema as JSON text
    jsonschema.validate(json.loads(person.choices[0].message.content), PERSON_SCHEMA)


def test_two_constraints_are_a_400_naming_both(client):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, {"regex": "[0-9]+", "guided_json": PERSON_SCHEMA})
    assert info.value.body["message"] == ("regex: only one output constraint per request; guided_json is set too")


@pytest.mark.parametrize("field", ["guided_whitespace_pattern", "xml_grammar", "structural_tag"])
def test_an_unknown_constraint_field_is_a_400_naming_it(client, field):
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, {field: "x"})
    assert info.value.body["param"] == field
    assert info.value.body["message"].startswith(f"{field}: is not an output constraint Formwork reads here")


def test_min_tokens_holds_off_eos_and_stop_strings(client):
    yes_or_no = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    short = ask(client, {}, yes_or_no, max_tokens=40)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 20  # EOS comes early
    held = ask(client, {"min_tokens": 20}, yes_or_no, max_tokens=40)
    assert held.usage.completion_tokens >= 20
    count = dict(model=MODEL, prompt="Count: one, two, three,", max_tokens=16, temperature=0, stop=[","])
    assert client.completions.create(**count).usage.completion_tokens < 6
    assert client.completions.create(**count, extra_body={"min_tokens": 6}).usage.completion_tokens >= 6


def test_min_tokens_gives_way_to_a_complete_constraint(client):
    answer = ask(client, {"guided_choice": ["yes", "no"], "min_tokens": 10},
                 [{"role": "user", "content": "Is the sky blue?"}])
    choice = answer.choices[0]
    assert choice.message.content in ("yes", "no") and choice.finish_reason == "stop"
    assert answer.usage.completion_tokens < 10


def test_continuous_usage_stats_put_usage_on_every_chunk(client):
    chunks = list(ask(client, {}, [{"role": "user", "content": "Name three colors."}], max_tokens=12, stream=True,
                      stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[0] == 0
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    assert counts[-2] == counts[-1] == chunks[-1].usage.total_tokens - chunks[-1].usage.prompt_tokens


def test_chat_template_kwargs_reach_the_template(client):
    # SmolLM2 has no think markers: enable_thinking is the template's to read, not a 400
    answer = ask(client, {"chat_template_kwargs": {"enable_thinking": True, "custom_flag": 1}},
                 [{"role": "user", "content": "Hi."}], max_tokens=4)
    assert answer.choices[0].message.content
