"""`formwork bench serve --workload tool-calls` beside its peers: how answers' calls are scored
(read from Hermes text or delivered by a chat stream), the streamed chat reader, the HTTP body, and
the chat a peer gets (checked against a server's own rendering with the real chat template)."""
from __future__ import annotations

import asyncio
import json

import pytest

from bench import report, serve_workloads
from bench.http_client import chat_body
from bench.peer_requests import peer_payload_requests
from bench.peers import records_from_peer
from bench.peers.chat_stream import ChatStream
from bench.request_record import RequestRecord
from bench.serve import Client


@pytest.fixture(scope="module")
def specs():
    return {s.request_id: s for s in serve_workloads.build("tool-calls", 64)}


def weather_call(city: str = "Toronto", unit: str = "celsius") -> str:
    arguments = json.dumps({"city": city, "unit": unit})
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'


def test_workload_offers_every_tool_with_the_choice_asked(specs):
    assert len(specs) == 12
    assert all(len(s.tools) == 12 and s.tool_choice == "required" for s in specs.values())
    assert {s.tool_choice for s in serve_workloads.build("tool-calls", 64, tool_choice="auto")} == {"auto"}
    assert {s.tool_choice for s in serve_workloads.build("tool-calls", 64, constrained=False)} == {"none"}
    with pytest.raises(ValueError, match="unknown tool choice 'named'"):
        serve_workloads.build("tool-calls", 64, tool_choice="named")


def test_calls_in_hermes_text_are_scored_against_their_tools_schemas(specs):
    spec = specs["call-01"]
    assert serve_workloads.score(spec, weather_call(), "stop") == (True, 1.0)
    assert serve_workloads.score(spec, weather_call(city="Paris"), "stop") == (True, 0.5)
    assert serve_workloads.score(spec, weather_call(), "length")[0] is False
    bad_unit = serve_workloads.tool_call_outcome(spec, weather_call(unit="kelvin"))  # not in the enum
    assert (bad_unit.num_calls, bad_unit.num_parsed, bad_unit.num_schema_valid, bad_unit.valid) == (1, 1, 0, False)
    chatty = serve_workloads.tool_call_outcome(spec, "Sure! " + weather_call())
    assert chatty.num_schema_valid == 1 and not chatty.only_calls and not chatty.valid
    unknown = serve_workloads.tool_call_outcome(spec, weather_call().replace("get_weather", "get_stock_price"))
    assert unknown.num_calls == 1 and unknown.num_schema_valid == 0
    # cut by max_tokens inside the arguments: one call whose arguments do not parse, no text beside it
    cut = serve_workloads.tool_call_outcome(spec, weather_call()[:40])
    assert (cut.num_calls, cut.num_parsed, cut.only_calls) == (1, 0, True)
    assert serve_workloads.tool_call_outcome(spec, "I cannot call tools.").num_calls == 0


def test_calls_a_chat_stream_delivered_are_scored_the_same(specs):
    spec = specs["call-01"]
    good = [("get_weather", '{"city": "Toronto", "unit": "celsius"}')]
    assert serve_workloads.score(spec, "", "stop", good) == (True, 1.0)
    assert serve_workloads.score(spec, "", "stop", []) == (False, 0.0)
    broken = serve_workloads.tool_call_outcome(spec, "", [("get_weather", '{"city": "Tor')])
    assert (broken.num_calls, broken.num_parsed, broken.valid) == (1, 0, False)
    two = serve_workloads.tool_call_outcome(spec, "", good * 2)
    assert two.num_calls == 2 and two.valid


def test_score_records_summarize_the_calls_per_answer(specs):
    records = [RequestRecord("call-01#0", 0.0, ok=True, text=weather_call(), finish_reason="stop"),
               RequestRecord("call-01#1", 0.0, ok=True, text=weather_call()[:40], finish_reason="length"),
               RequestRecord("call-01#2", 0.0, ok=True, text="", finish_reason="stop",
                             tool_calls=[("get_weather", '{"city": "Oslo", "unit": "celsius"}')] * 2),
               RequestRecord("call-01#3", 0.0, ok=False, error="UNAVAILABLE")]
    summary = serve_workloads.score_records(specs, records)
    assert (summary["num_valid"], summary["num_length_capped"], summary["num_finished_invalid"]) == (2, 1, 0)
    calls = summary["tool_calls"]
    assert calls["num_answers"] == 3 and calls["calls_per_answer"] == {1: 2, 2: 1}
    assert (calls["num_calls"], calls["num_calls_parsed"], calls["num_calls_schema_valid"]) == (4, 3, 3)
    assert calls["num_answers_arguments_parse"] == 2 and calls["num_answers_with_text"] == 0
    run = {"system": "vllm-http", "mode": "constrained", "tool_choice": "required", "concurrency": 8,
           "num_requests": 4, "output_token_throughput": 50.0, "ttft_s_p50": 0.5, "itl_s_p50": 0.1, **summary}
    row = report.tool_call_table([run]).splitlines()[-1]
    assert row.startswith("| vllm-http | constrained | required | c=8 | 2/4 | 2 / 1 | 1: 2, 2: 1 | 2/3 | 3/4 |")
    assert report.tool_call_table([{"system": "formwork"}]) == ""


def test_chat_stream_pieces_together_content_and_calls():
    lines = [
        'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}',
        "",
        'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c0", "type": "function", '
        '"function": {"name": "get_weather", "arguments": ""}}]}}]}',
        'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\\"city\\": "}}]}}]}',
        'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\\"Oslo\\"}"}}]}}]}',
        'data: {"choices": [{"index": 0, "delta": {"content": "done"}, "finish_reason": "tool_calls"}]}',
        'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}}',
        "data: [DONE]",
    ]
    stream = ChatStream()
    num_read = next(i for i, line in enumerate(lines) if not stream.feed(line, 0.1 * i))
    assert num_read == len(lines) - 1  # [DONE] ends the stream
    assert stream.tool_calls == [("get_weather", '{"city": "Oslo"}')]
    assert stream.content == "done" and stream.finish_reason == "tool_calls"
    assert stream.final_chunk["usage"]["completion_tokens"] == 7
    assert stream.token_times_s == pytest.approx([0.2, 0.3, 0.4, 0.5])  # the chunks with a name, arguments or text
    failed = ChatStream()
    assert failed.feed('data: {"error": {"message": "tool_choice needs a parser"}}', 0.0) is False
    assert failed.error == "tool_choice needs a parser"


def test_http_body_carries_the_tools_in_openai_shape(specs):
    body = chat_body(specs["call-02"])
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert [t["type"] for t in body["tools"]] == ["function"] * 12
    assert body["tools"][1]["function"] == specs["call-02"].tools[1]
    plain = chat_body(serve_workloads.build("json-extraction", 32)[0])
    assert "tools" not in plain and "tool_choice" not in plain


def test_peer_records_keep_the_calls_they_delivered():
    run = {"records": [{"id": "call-01#0", "text": "", "tool_calls": [["get_weather", "{}"]], "ttft_s": 0.1,
                        "e2e_s": 0.2, "token_times_s": [0.1, 0.2]},
                       {"id": "people-01#0", "text": "{}", "ttft_s": 0.1, "e2e_s": 0.2}]}
    with_calls, plain = records_from_peer(run)
    assert with_calls.tool_calls == [("get_weather", "{}")] and plain.tool_calls is None


@pytest.fixture(scope="module")
def fake_server():
    from inproc_server import InprocServer
    server = InprocServer(step_s=0.01)
    yield server
    server.close()


def test_a_peer_gets_a_chat_that_its_template_renders_to_formworks_prompt(fake_server, specs):
    """SmolLM2's template has no tools: the chat carries Formwork's tool prompt, and rendered alone
    (as vLLM's chat endpoint renders it) it gives exactly the token ids of the server's prompt."""
    async def go():
        client = Client(f"127.0.0.1:{fake_server.port}", rpc_timeout_s=30)
        try:
            requests = await peer_payload_requests(client, [specs["call-01"], specs["call-02"]], 3)
            return requests, [await client.prompt_token_ids(r["messages"]) for r in requests]
        finally:
            await client.close()

    requests, rendered_alone = asyncio.run(go())
    assert [r["id"] for r in requests] == ["call-01#0", "call-02#1", "call-01#2"]
    for request, token_ids in zip(requests, rendered_alone):
        assert token_ids == request["prompt_token_ids"]
        assert request["messages"][0]["role"] == "system" and "<tools>" in request["messages"][0]["content"]
        assert request["messages"][-1] == specs[request["id"].split("#")[0]].messages[-1]
        assert request["tool_choice"] == "required" and request["parallel_tool_calls"] is False
        assert all(t["function"]["strict"] is True for t in request["tools"])
        assert request["schema"] is None


def test_a_grpc_answer_is_scored_by_the_calls_the_server_parsed_in_its_syntax(specs):
    """In a non-Hermes syntax the text holds no <tool_call> blocks: the server's parsed calls count."""
    from bench.serve import take_parsed_calls
    from service._gen.formwork.v1 import generation_pb2 as pb

    pythonic_text = '[get_weather(city="Toronto", unit="celsius")]'
    assert serve_workloads.score(specs["call-01"], pythonic_text, "stop")[0] is False  # read as Hermes text
    final = pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP, content="", tool_calls=[pb.ToolCall(
        id="call_0", name="get_weather", arguments_json='{"city": "Toronto", "unit": "celsius"}')])
    record = RequestRecord("call-01#0", sent_at=0.0, text=pythonic_text)
    take_parsed_calls(record, final)
    assert record.text == "" and record.tool_calls == [("get_weather", '{"city": "Toronto", "unit": "celsius"}')]
    assert serve_workloads.score(specs["call-01"], record.text, "stop", record.tool_calls) == (True, 1.0)
    talk = pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP, content="I cannot call tools.")
    take_parsed_calls(record, talk)
    assert record.tool_calls == [] and serve_workloads.score(specs["call-01"], record.text, "stop",
                                                              record.tool_calls)[0] is False


def test_the_tool_call_syntax_reaches_the_started_server_and_the_vllm_parser():
    from bench.peer_requests import VLLM_TOOL_PARSERS
    from bench.serve_bench import SERVER_ARGS, server_args
    from cli.main import build_parser
    from grammar.chat.tool_calls import SYNTAXES

    parser = build_parser()
    args = parser.parse_args(["bench", "serve", "--workload", "tool-calls", "--tool-call-syntax", "pythonic"])
    assert server_args(args) == SERVER_ARGS + ["--tool-call-syntax", "pythonic"]
    assert server_args(parser.parse_args(["bench", "serve"])) == SERVER_ARGS  # the model's own syntax
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "serve", "--tool-call-syntax", "klingon"])
    assert set(VLLM_TOOL_PARSERS) == set(SYNTAXES)
    assert VLLM_TOOL_PARSERS["phi4_mini"] == "phi4_mini_json"
    assert VLLM_TOOL_PARSERS["tool_code"] == ""  # vLLM reads no ```tool_code block: its run is skipped
