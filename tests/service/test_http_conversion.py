"""OpenAI request bodies -> the service's wire-neutral GenerationRequests (service/http/conversion.py),
and the errors they give, named as the HTTP request names its fields. Pure: no server, no model."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pydantic
import pytest

from live_server import REPO_ROOT
from service.errors import ServiceError
from service.http.conversion import translate_chat, translate_completion
from service.http.errors import http_error
from service.http.protocol import ChatCompletionRequest, CompletionRequest
from service.limits import ServiceLimits
from service.request import PromptInput
from service.validation import sampling_params

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def as_dict(struct) -> dict:
    """The fields of a request struct that are set (not None, not empty)."""
    return {name: value for name, value in dataclasses.asdict(struct).items() if value not in (None, (), "")}


def test_sampling_fields_and_chat_messages():
    translated = translate_chat(chat(
        temperature=0, top_p=0.5, top_k=-1, seed=3, stop="\n", max_completion_tokens=9, max_tokens=99,
        logprobs=True, top_logprobs=2, n=2, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
                  {"role": "user", "content": "hi"}]))
    request = translated.request
    assert as_dict(request.sampling) == {"temperature": 0.0, "top_p": 0.5, "top_k": 0, "seed": 3, "stop": ("\n",),
                                         "max_tokens": 9, "logprobs": 2}
    assert request.prompts[0].messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (translated.num_choices, translated.stream, translated.include_usage) == (2, True, True)


def test_speculative_is_a_formwork_option_set_only_when_given():
    assert as_dict(translate_chat(chat(formwork={"speculative": True})).request.sampling) == {"speculative": True}
    assert as_dict(translate_chat(chat(formwork={"speculative": False})).request.sampling) == {"speculative": False}
    assert "speculative" not in as_dict(translate_chat(chat(formwork={"priority": 1})).request.sampling)
    assert as_dict(translate_completion(CompletionRequest.model_validate(
        {"prompt": "hi", "formwork": {"speculative": True}})).request.sampling) == {"speculative": True}


def test_every_constraint_field_keeps_the_schema_order():
    for fields, kind in [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": False}}},
         "json_schema_text"),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema_text"),
        ({"guided_json": json.dumps(SCHEMA)}, "json_schema_text"),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"guided_regex": "a+"}, "regex"),
        ({"structured_outputs": {"choice": ["x", "y"]}}, "choice"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar"),
    ]:
        constraint = translate_chat(chat(**fields)).request.constraint
        assert constraint.kind == kind, fields
        if kind == "json_schema_text":
            assert list(json.loads(constraint.spec)["properties"]) == ["b", "a"]  # declared order: the output's
    strict = translate_chat(chat(**{"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": SCHEMA, "strict": False}}})).request.constraint
    assert strict.strict is False
    options = translate_chat(chat(guided_regex="a", formwork={"any_whitespace": True, "jump_forward": False}))
    assert as_dict(options.request.constraint) == {"kind": "regex", "spec": "a", "any_whitespace": True,
                                                   "jump_forward": False}
    spaced = translate_chat(chat(guided_json=SCHEMA, formwork={"whitespace": "spaced"}))
    assert spaced.request.constraint.whitespace == "spaced"
    lark = translate_chat(chat(guided_grammar='start: "a"', formwork={"grammar_syntax": "lark"}))
    assert as_dict(lark.request.constraint) == {"kind": "grammar", "spec": 'start: "a"', "grammar_syntax": "lark"}


@pytest.mark.parametrize("fields, message", [
    ({"functions": [{"name": "f"}]}, "functions: the legacy functions field is not supported; use tools"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools: is set by the request's own tools field"),
    ({"guided_json": SCHEMA, "regex": "a"}, "regex: only one output constraint per request; guided_json is set too"),
    ({"ebnf": 'root ::= "a"', "json_schema": SCHEMA}, "ebnf: only one output constraint per request; json_schema is"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "structured_outputs.regex: only one output constraint per request; response_format is set too"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern: is not an output constraint Formwork reads"),
    ({"xml_schema": "<a/>"}, "xml_schema: is not an output constraint Formwork reads"),
    ({"best_effort_grammar": "x"}, "best_effort_grammar: is not an output constraint Formwork reads"),
    ({"length_penalty": 1.1}, "length_penalty: is not supported by this server"),
    ({"skip_special_tokens": False}, "skip_special_tokens: only True is supported"),
    ({"min_tokens": -1}, "min_tokens: must be >= 0, got -1"),
    ({"messages": [{"role": "user", "content": "hi", "audio": {"id": "a"}}]}, "messages[0].audio: is not supported"),
    ({"messages": [{"role": "assistant", "content": "", "refusal": "no"}]}, "messages[0].refusal: is not supported"),
    ({"logit_bias": {"1": 2.0}}, "logit_bias: is not supported"),
    ({"n": 17}, "n: must be in [1, 16], got 17"),
    ({"top_logprobs": 1}, "top_logprobs: needs logprobs: true"),
    ({"max_tokens": -1}, "max_tokens: must be >= 1, got -1"),
    ({"stream_options": {"include_usage": True}}, "stream_options: is only allowed with stream: true"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice: only one output constraint per request"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs: set exactly one of"),
    ({"formwork": {"strict": False}}, "formwork: strict, whitespace, any_whitespace and jump_forward need an output constraint"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema: is required"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]: only text parts are supported, got type 'image_url'"),
])
def test_refusals_name_the_http_field(fields, message):
    with pytest.raises(ServiceError) as info:
        translate_chat(chat(**fields))
    assert info.value.message.startswith(message)
    assert http_error(info.value).status == 400


def test_peers_constraint_fields_keep_their_meaning():
    assert as_dict(translate_chat(chat(regex="[0-9]+")).request.constraint) == {"kind": "regex", "spec": "[0-9]+"}
    assert as_dict(translate_chat(chat(ebnf='root ::= "a"')).request.constraint) == {
        "kind": "grammar", "spec": 'root ::= "a"', "grammar_syntax": "ebnf"}
    for schema in (SCHEMA, json.dumps(SCHEMA)):  # SGLang sends it as JSON text; inline works too
        constraint = translate_completion(CompletionRequest(prompt="a", json_schema=schema)).request.constraint
        assert constraint.kind == "json_schema_text" and json.loads(constraint.spec) == SCHEMA
    structured = {"json_object": True}
    assert translate_chat(chat(structured_outputs=structured)).request.constraint.kind == "json_object"
    assert translate_chat(chat(structured_outputs={"grammar": 'root ::= "a"'})).request.constraint.kind == "grammar"


def test_a_bad_sglang_field_is_named_in_the_compile_error():
    translated = translate_chat(chat(json_schema='{"type": "object"'))
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, ServiceLimits(), 1000)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "json_schema" and renamed.message.startswith("json_schema: json_schema is not valid JSON")


def test_min_tokens_and_its_range():
    assert translate_chat(chat(min_tokens=3)).request.sampling.min_tokens == 3
    translated = translate_chat(chat(min_tokens=9, max_tokens=4))
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, ServiceLimits(), 1000)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "min_tokens" and renamed.message == "min_tokens: must be in [0, max_tokens (4)], got 9"


def test_continuous_usage_stats():
    translated = translate_chat(chat(stream=True, stream_options={"continuous_usage_stats": True}))
    assert translated.continuous_usage and not translated.include_usage
    assert not translate_chat(chat(stream=True)).continuous_usage


def test_chat_template_kwargs_all_go_to_the_template():
    kwargs = {"enable_thinking": True, "add_vision_id": True, "custom": [1, 2]}
    options = translate_chat(chat(chat_template_kwargs=kwargs)).request.chat
    assert options.template_kwargs == kwargs and options.thinking is True


def test_an_earlier_answers_reasoning_goes_to_the_template_and_function_strict_is_accepted():
    translated = translate_chat(chat(
        messages=[{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "hello", "reasoning_content": "greet back", "refusal": None}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}]))
    assert translated.request.prompts[0].messages[1]["reasoning_content"] == "greet back"
    assert [t.name for t in translated.request.chat.tools] == ["f"]


@pytest.mark.parametrize("fields, path", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strictness": 1}}},
     ("response_format", "json_schema", "strictness")),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameter": {}}}]},
     ("tools", 0, "function", "parameter")),
])
def test_nested_objects_refuse_fields_they_do_not_read(fields, path):
    with pytest.raises(pydantic.ValidationError) as info:
        chat(**fields)
    assert info.value.errors()[0]["loc"] == path and info.value.errors()[0]["type"] == "extra_forbidden"


def test_fields_openai_documents_as_ignorable_are_ignored():
    translated = translate_chat(chat(user="u", store=True, metadata={"a": "b"}, service_tier="auto",
                                     prompt_cache_key="k", safety_identifier="s", skip_special_tokens=True,
                                     guided_decoding_backend="xgrammar"))
    assert translated.request.constraint is None


def test_grpc_validation_errors_come_back_with_http_names():
    translated = translate_chat(chat(guided_json='{"type": "object"', max_completion_tokens=5000))
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, ServiceLimits(), 1000)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "max_completion_tokens"
    assert renamed.message == "max_completion_tokens: 5000 exceeds this server's max_tokens_cap of 4096"
    translated = translate_chat(chat(guided_json='{"type": "object"'))
    with pytest.raises(ServiceError) as info:
        sampling_params(translated.request, ServiceLimits(), 1000)
    renamed, param = translated.field_names.rename(info.value)
    assert param == "guided_json" and renamed.message.startswith("guided_json: json_schema is not valid JSON")
    big = translate_chat(chat(guided_regex="a" * 300))
    with pytest.raises(ServiceError) as info:
        sampling_params(big.request, ServiceLimits(max_constraint_bytes=256), 1000)
    renamed, param = big.field_names.rename(info.value)
    assert renamed.message == "guided_regex: is 300 bytes; this server's max_constraint_bytes is 256"
    assert http_error(renamed, param).status == 413


def test_completion_prompts():
    def prompts(prompt) -> list[PromptInput]:
        return list(translate_completion(CompletionRequest(prompt=prompt)).request.prompts)

    assert prompts("a") == [PromptInput("prompt", text="a")]
    assert prompts(["a", "b"]) == [PromptInput("prompt", text="a"), PromptInput("prompt", text="b")]
    assert prompts([1, 2]) == [PromptInput("prompt_token_ids", token_ids=[1, 2])]
    assert prompts([[1], [2, 3]]) == [PromptInput("prompt_token_ids", token_ids=[1]),
                                      PromptInput("prompt_token_ids", token_ids=[2, 3])]
    with pytest.raises(ServiceError, match=r"prompt: token ids must be in \[0, 2\^32\); got \[-1\]"):
        translate_completion(CompletionRequest(prompt=[-1]))
    with pytest.raises(ServiceError, match="echo: echoing the prompt is not supported"):
        translate_completion(CompletionRequest(prompt="a", echo=True))


def test_the_web_stack_stays_in_service_http_and_out_of_torch():
    code = ("import sys; import service.grpc.server, service.cli; "
            "assert not {'fastapi', 'uvicorn', 'starlette'} & set(sys.modules), 'web stack imported'; "
            "import service.http.server, grammar.xgrammar.lark_grammar; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
