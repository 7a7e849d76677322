"""The OpenAI-compatible HTTP API with the real `openai` SDK (and LangChain, curl) against a live
`formwork serve` on the real model: one server for the module, small max_tokens."""
from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from live_server import PERSON_SCHEMA, LiveServer, chat
from service._gen.formwork.v1 import generation_pb2 as pb

pytestmark = pytest.mark.slow

MAX_NUM_SEQS = 4
MAX_QUEUE_LEN = 4
MAX_MESSAGE_BYTES = 64 << 10
MAX_CONSTRAINT_BYTES = 2048
MODEL = "SmolLM2-135M-Instruct"
BIG_SCHEMA = {"type": "object", "description": "x" * MAX_CONSTRAINT_BYTES}
ASK_PERSON = [{"role": "user", "content": "Invent a person. Answer in JSON."}]


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def server():
    live = LiveServer("--max-num-seqs", str(MAX_NUM_SEQS), "--max-queue-len", str(MAX_QUEUE_LEN),
                      "--max-message-bytes", str(MAX_MESSAGE_BYTES), "--max-constraint-bytes", str(MAX_CONSTRAINT_BYTES),
                      startup_timeout_s=900)  # a shared machine may be building the CPU kernels
    yield live
    assert live.stop() == 0, live.log()


@pytest.fixture(scope="module")
def client(server):
    # no retries: a 429 or 503 is what the test checks, not something to wait out
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


# ---- generation -------------------------------------------------------------------------------


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.http_url}/health").json() == {"status": "ok"}


def test_json_schema_response_format_validates(client):
    response = client.chat.completions.create(
        model=MODEL, messages=ASK_PERSON, max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    jsonschema.validate(json.loads(choice.message.content), PERSON_SCHEMA)
    usage = response.usage
    assert usage.prompt_tokens > 10 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 <= usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens
    timings = response.model_extra["formwork"]["choices"][0]["timings"]
    assert 0 < timings["time_to_first_token_s"] <= timings["total_s"]


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(model=MODEL, messages=ASK_PERSON, max_tokens=48, temperature=0,
                                               response_format=Person)
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120 and len(person.name) <= 12


def test_stream_with_usage_adds_up_to_the_whole_answer(client):
    request = dict(model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=16,
                   temperature=0)
    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens


def test_n_choices_share_the_prompt(client):
    colors = ["red", "green", "blue", "yellow"]
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Pick a color."}], n=3, max_tokens=8, temperature=1.0,
        seed=7, extra_body={"guided_choice": colors})
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert all(c.message.content in colors and c.finish_reason == "stop" for c in response.choices)
    assert len(response.model_extra["formwork"]["choices"]) == 3
    streamed = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}], n=3, max_tokens=6, temperature=0,
        stream=True))
    texts = ["".join(c.choices[0].delta.content or "" for c in streamed if c.choices[0].index == i) for i in range(3)]
    assert texts[0] and texts[0] == texts[1] == texts[2]  # greedy: the same answer three times


def test_logprobs(client):
    response = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                              max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert "".join(t.token for t in content) == response.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 2 and token.logprob <= 0
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob, abs=1e-4)  # greedy: the top token


def test_completions_prompts_token_ids_and_lark_grammar(client):
    texts = client.completions.create(model=MODEL, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=4, temperature=0,
                                      logprobs=1)
    assert [c.index for c in texts.choices] == [0, 1]
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) > 0 for c in texts.choices)
    assert all("".join(c.logprobs.tokens) == c.text for c in texts.choices)
    ids = client.completions.create(model=MODEL, prompt=[[16, 28, 17], [16, 28, 17]], max_tokens=4, temperature=0)
    assert ids.choices[0].text == ids.choices[1].text and ids.usage.prompt_tokens == 6
    # vLLM's Lark fixture, as vLLM users send it
    lark = ('start: select_statement\nselect_statement: "SELECT " column " from " table\n'
            'column: "col_1" | "col_2"\ntable: "table_1" | "table_2"\n')
    sql = client.completions.create(model=MODEL, prompt="SQL:", max_tokens=20, temperature=0,
                                    extra_body={"guided_grammar": lark})
    assert sql.choices[0].text in {f"SELECT {c} from {t}" for c in ("col_1", "col_2") for t in ("table_1", "table_2")}


def test_grpc_takes_a_lark_grammar_too(server):
    response = server.stub.Generate(chat("Yes or no?", max_tokens=8, temperature=0,
                                         constraint={"grammar": 'start: answer\nanswer: "yes" | "no"'}), timeout=60)
    assert response.finish_reason == pb.FINISH_REASON_STOP and response.text in ("yes", "no")


def test_langchain_with_structured_output(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    model = langchain_openai.ChatOpenAI(base_url=f"{server.http_url}/v1", api_key="unused", model=MODEL,
                                        temperature=0, max_tokens=48, max_retries=0)
    person = model.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
    assert isinstance(person, Person)


def test_curl_streams(server):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                       "stream": True})
    result = subprocess.run(["curl", "-sSN", f"{server.http_url}/v1/chat/completions", "-H",
                             "Content-Type: application/json", "-d", body], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    events = [line for line in result.stdout.splitlines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_disconnect_mid_stream_frees_the_kv_blocks(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 200,
            "temperature": 0, "stream": True, "formwork": {"priority": 0}}
    with httpx.stream("POST", f"{server.http_url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]  # a few chunks: the request is running
        assert any(line.startswith("data: ") for line in received)
        assert server.model_info().load.num_running == 1
    load = server.wait_idle()
    assert load.num_running == load.num_in_flight == 0
    assert load.num_free_kv_blocks == load.num_total_kv_blocks


def test_a_disconnect_before_a_whole_answer_aborts_it(server):
    # 256 tokens take seconds; the request must end as soon as its client is gone, not at max_tokens
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 256,
            "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
    load = server.wait_idle(timeout_s=2.0)
    assert load.num_running == load.num_in_flight == 0
    assert load.num_free_kv_blocks == load.num_total_kv_blocks
    assert "the client disconnected before the answer" in server.log()


# ---- errors -----------------------------------------------------------------------------------


def error_of(call, *args, **kwargs) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        result = call(*args, **kwargs)
        if isinstance(result, openai.Stream):
            list(result)
    return info.value


@pytest.mark.parametrize("fields, status, param, message", [
    ({"temperature": -1}, 400, "temperature", "temperature: must be >= 0, got -1.0"),
    ({"max_tokens": 100000}, 400, "max_tokens", "max_tokens: 100000 exceeds this server's max_tokens_cap of 256"),
    ({"top_logprobs": 2}, 400, "top_logprobs", "top_logprobs: needs logprobs: true"),
    ({"n": 0}, 400, "n", "n: must be in [1, 16], got 0"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$dynamicRef": "#a"}}}}}], "tool_choice": "required"}, 400, "tools",
     'tools: tools[0] "f" parameters: unsupported keyword "$dynamicRef" at /properties/a'),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$dynamicRef": "#a"}}}}}},
     400, "response_format.json_schema.schema",
     'response_format.json_schema.schema: unsupported keyword "$dynamicRef" at /properties/a'),
    ({"structured_outputs": {"regex": "[a-"}}, 400, "structured_outputs.regex",
     "structured_outputs.regex: regex does not compile"),
    ({"guided_grammar": "start: item"}, 400, "guided_grammar",
     "guided_grammar: grammar (Lark) is not supported: Lark grammar line 1: 'item' is used but never defined"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, 400, "guided_choice",
     "guided_choice: only one output constraint per request; guided_regex is set too"),
    ({"guided_json": BIG_SCHEMA}, 413, "guided_json",
     f"guided_json: is {len(json.dumps(BIG_SCHEMA))} bytes; this server's max_constraint_bytes is {MAX_CONSTRAINT_BYTES}"),
    ({"model": "gpt-4"}, 404, None, "the model 'gpt-4' does not exist"),
])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_errors_have_the_status_and_the_precise_message(client, fields, status, param, message, stream):
    fields = dict(fields)
    body = {"model": fields.pop("model", MODEL), "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
            "stream": stream}
    known = {k: fields.pop(k) for k in list(fields) if k in ("temperature", "max_tokens", "top_logprobs", "n", "tools",
                                                                "response_format")}
    error = error_of(client.chat.completions.create, **{**body, **known}, extra_body=fields)
    assert error.status_code == status
    detail = error.body
    assert detail["message"].startswith(message), detail
    assert detail["param"] == param and detail["type"]


def test_route_body_size_and_queue_errors(server, client):
    missing = httpx.post(f"{server.http_url}/v1/embeddings", json={})
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no route POST /v1/embeddings"
    big = error_of(client.chat.completions.create, model=MODEL, max_tokens=4,
                   messages=[{"role": "user", "content": "x" * MAX_MESSAGE_BYTES}])
    assert big.status_code == 413 and "max_message_bytes is 65536" in big.body["message"]
    not_json = httpx.post(f"{server.http_url}/v1/completions", content=b"{nope")
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    # fill the server: MAX_NUM_SEQS running + MAX_QUEUE_LEN waiting, then one more is a 429
    capacity = MAX_NUM_SEQS + MAX_QUEUE_LEN
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "n": capacity, "stream": True}
    with httpx.stream("POST", f"{server.http_url}/v1/completions", json=body, timeout=60) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        full = error_of(client.completions.create, model=MODEL, prompt="x", max_tokens=4)
        assert full.status_code == 429 and full.body["message"].startswith("the queue is full"), full.body
    assert server.wait_idle().num_in_flight == 0
