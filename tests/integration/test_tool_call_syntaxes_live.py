"""`formwork serve --tool-call-syntax NAME` on the real default model (SmolLM2, a hermes model
forced into another family's syntax): the openai SDK's calls, unary and streamed, name a tool and
validate against its schema, and the streamed deltas add up to the unary call."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from live_server import LiveServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                            "metric": {"type": "boolean"}},
           "required": ["city", "metric"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What will the weather be in Paris over the next 3 days?"}]


@pytest.fixture(scope="module", params=["qwen3_coder", "pythonic", "tool_code"])
def served(request, model_dir):
    live = LiveServer("--tool-call-syntax", request.param, startup_timeout_s=900)
    with openai.OpenAI(base_url=f"{live.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield request.param, live, client
    assert live.stop() == 0, live.log()


def test_calls_in_the_forced_syntax_validate_and_stream_as_the_unary_call(served):
    syntax, live, client = served
    assert live.model_info().tool_call_syntax == syntax
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_tokens=80, temperature=0)
    unary = client.chat.completions.create(**kwargs).choices[0]
    assert unary.finish_reason == "tool_calls" and unary.message.content is None
    [call] = unary.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    state = ChatCompletionStreamState(input_tools=TOOLS)
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        state.handle_chunk(chunk)
    streamed = state.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (call.function.name, call.function.arguments)]
