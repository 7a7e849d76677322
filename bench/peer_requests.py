"""The requests `formwork bench serve` hands its peers (bench/peers/__init__.py has the contract):
the same prompt token ids Formwork's server renders, and for tool calls the same chat, written so
that a peer rendering it with the model's own template (as vLLM's chat endpoint does) gets those
token ids too."""
from __future__ import annotations

from bench.serve import Client, RequestSpec
from engine.frontend.tool_prompt import messages_with_tools
from grammar.chat.tool_calls import SYNTAXES

# Formwork's tool-call syntax -> the vLLM tool-call parser that reads it ("": vLLM has none)
VLLM_TOOL_PARSERS = {"hermes": "hermes", "llama3_json": "llama3_json", "mistral": "mistral",
                     "phi4_mini": "phi4_mini_json", "qwen3_coder": "qwen3_coder", "pythonic": "pythonic",
                     "tool_code": ""}


def _template_tools(tools: list[dict]) -> list[dict]:
    """Tools as the server hands them to the chat template (transformers' function shape)."""
    out = []
    for tool in tools:
        function = {"name": tool["name"], "parameters": tool["parameters"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


async def peer_messages(client: Client, spec: RequestSpec, prompt_token_ids: list[int], syntax: str) -> list[dict]:
    """The chat a peer renders with the model's own template (as vLLM's chat endpoint does) into
    the prompt Formwork gives: for a template without tools, the messages with Formwork's tool
    prompt written in (checked to give the same token ids); else the messages as they are."""
    written = messages_with_tools(spec.messages, _template_tools(spec.tools or []), SYNTAXES[syntax])
    if await client.prompt_token_ids(written) == prompt_token_ids:
        return written
    return spec.messages


async def peer_payload_requests(client: Client, specs: list[RequestSpec], n: int, syntax: str = "hermes") -> list[dict]:
    """The first `n` of `specs` (cycled) for the peer contract; tool-call specs as chats with their
    tools (OpenAI's shape, `strict`: arguments held to their schemas, as Formwork's are by default)."""
    out = []
    for i in range(n):
        spec = specs[i % len(specs)]
        request = {"id": f"{spec.request_id}#{i}", "prompt_token_ids": await client.prompt_token_ids(
                       spec.messages, spec.tools), "schema": spec.schema, "max_tokens": spec.max_tokens}
        if spec.tools:
            request.update(messages=await peer_messages(client, spec, request["prompt_token_ids"], syntax),
                           tools=[{"type": "function", "function": {**tool, "strict": True}} for tool in spec.tools],
                           tool_choice=spec.tool_choice, parallel_tool_calls=False)
        out.append(request)
    return out
