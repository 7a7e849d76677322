"""Tools in a chat prompt for each kind of template: one that reads a `tools` variable, one that
reads them off the system message (Phi-4-mini's), and one without tools (the tool prompt)."""
from __future__ import annotations

import json

from engine.frontend.tokenizer import _compile_chat_template
from engine.frontend.tool_prompt import render_inputs
from grammar.chat.tool_calls import SYNTAXES, syntax_for_model

# Phi-4-mini-instruct's chat template (tokenizer_config.json): the tools come as JSON text on the
# system message, between <|tool|> and <|/tool|>, and every message renders only its content
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
    "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def rendered(messages, template=PHI4_MINI_TEMPLATE) -> str:
    syntax = SYNTAXES[syntax_for_model("phi3", template)]
    chat, variables = render_inputs(messages, [WEATHER], template, syntax)
    return _compile_chat_template(template).render(messages=chat, add_generation_prompt=True,
                                                   eos_token="<|endoftext|>", **{"tools": None, **variables})


def test_phi4_mini_reads_the_tools_off_the_system_message():
    listed = json.dumps([WEATHER["function"]])
    assert rendered([{"role": "user", "content": "Weather in Paris?"}]) == (
        f"<|system|><|tool|>{listed}<|/tool|><|end|><|user|>Weather in Paris?<|end|><|assistant|>")
    with_system = rendered([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert with_system.startswith(f"<|system|>Be brief.<|tool|>{listed}<|/tool|><|end|><|user|>Hi")


def test_phi4_mini_earlier_calls_are_written_in_its_syntax():
    prompt = rendered([{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": "", "tool_calls": [CALL]},
                       {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}])
    assert ('<|assistant|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>'
            '<|end|><|tool|>{"sky": "clear"}<|end|>') in prompt


def test_a_template_with_a_tools_variable_gets_them_there():
    template = "{% for t in tools %}{{ t.function.name }};{% endfor %}{{ messages[0].content }}"
    assert rendered([{"role": "user", "content": "Hi"}], template) == "get_weather;Hi"
