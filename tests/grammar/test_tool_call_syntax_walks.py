"""Each call syntax's constrained calls, walked at random on both backends (SmolLM2's tokenizer):
every walk reads back as calls of the offered tools whose arguments validate against the tool's
schema, and those calls render and read back to the same OpenAI tool_calls."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from grammar_factories import make_backend, make_llguidance_backend
from rewrite_sampling import validator

from bench.datasets import jsonschemabench_dir
from grammar.backend import GrammarError
from grammar.chat.tool_calls import SYNTAXES, Tool, ToolCalls
from grammar.constraint import Constraint

MAX_WALK_TOKENS = 40
NUM_WALKS = 6
# a sample of tool schemas: raw and bounded strings, enums, numbers, booleans, arrays, nested
# objects, $defs, optional parameters, and a tool without parameters
TOOLS = (
    Tool("get_weather", "", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}),
    Tool("edit_file", "", {"type": "object", "properties": {
        "path": {"type": "string", "pattern": "^[a-z/]{1,12}\\.py$"}, "old": {"type": "string", "maxLength": 16},
        "new": {"type": "string"}, "count": {"type": ["integer", "null"]}}, "required": ["path", "old", "new"]}),
    Tool("search", "", {"type": "object", "properties": {
        "query": {"type": "string", "minLength": 1}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                              "maxItems": 3},
        "exact": {"type": "boolean"}, "score": {"type": "number"}}, "required": ["query", "exact"]}),
    Tool("book", "", {"type": "object", "$defs": {"when": {"type": "object", "properties": {
        "day": {"type": "integer"}, "hour": {"type": "integer"}}, "required": ["day"]}},
        "properties": {"room": {"const": "blue"}, "at": {"$ref": "#/$defs/when"}}, "required": ["room", "at"]}),
    Tool("now", "", {"type": "object", "properties": {}}),
)


def _sampled_tools() -> tuple[Tool, ...]:
    """Object schemas with properties from the carried JSONSchemaBench sample, as tools' parameters:
    the smallest of each subset, the same ones every run."""
    tools = []
    for path in sorted(jsonschemabench_dir().glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        fitting = sorted((r for r in rows if isinstance(r["schema"], dict) and r["schema"].get("type") == "object"
                          and isinstance(r["schema"].get("properties"), dict) and r["schema"]["properties"]
                          and '"format"' not in json.dumps(r["schema"]) and len(json.dumps(r["schema"])) < 1500),
                         key=lambda r: (len(json.dumps(r["schema"])), r["id"]))
        tools += [Tool("t_" + re.sub(r"[^A-Za-z0-9_]", "_", r["id"])[:60], "", r["schema"]) for r in fitting[:1]]
    return tuple(tools[:NUM_SAMPLED])


NUM_SAMPLED = 8
SAMPLED = _sampled_tools()
NEW_SYNTAXES = ("qwen3_coder", "pythonic", "phi4_mini", "tool_code")


def _walk(backend, grammar, rng: random.Random) -> list[int]:
    """Random allowed tokens (short plain ones first, so that values end), then a closing."""
    bitmask = backend.allocate_bitmask(1)
    stop_ids = set(backend.stop_token_ids)
    plain = np.array([all(0x20 <= b < 0x7F or b == 0x0A for b in t) and b"\\" not in t for t in backend.token_bytes])
    short = np.array([len(t) <= 2 for t in backend.token_bytes])
    token_ids: list[int] = []
    for _ in range(MAX_WALK_TOKENS):
        if grammar.is_terminated():
            return token_ids
        grammar.fill_bitmask(bitmask, 0)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8)[0], bitorder="little")[:len(plain)].astype(bool)
        for stop_id in stop_ids:
            bits[stop_id] = False
        choices = next((c for c in (np.flatnonzero(bits & p) for p in (plain & short, plain, bits)) if len(c)), None)
        if choices is None:
            break
        token_id = int(rng.choice(choices.tolist()))
        assert grammar.accept_tokens([token_id])
        token_ids.append(token_id)
    closing = grammar.closing_token_ids(400, max_cpu_s=30.0)  # bounded by its node count, not the clock
    assert closing is not None, f"no closing found after {backend.tokenizer.decode(token_ids)!r}"
    closing = [t for t in closing if t not in stop_ids]
    assert grammar.accept_tokens(closing)
    return token_ids + closing


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("syntax", NEW_SYNTAXES)
@pytest.mark.parametrize("tool", TOOLS + SAMPLED, ids=[t.name for t in TOOLS + SAMPLED])
def test_walks_read_back_as_valid_calls(syntax, tool, backend_name):
    backend = make_backend() if backend_name == "xgrammar" else make_llguidance_backend()
    spec = ToolCalls(TOOLS + SAMPLED, "named", tool.name, parallel=False, syntax=syntax)
    try:
        compiled = backend.compile(Constraint("tool_calls", spec.to_spec(), strict=False))
    except GrammarError as e:
        assert tool in SAMPLED, e  # a sampled schema this backend does not compile: nothing to walk
        pytest.skip(f"{backend_name} does not compile it: {e}")
    check = validator(tool.schema)
    rng = random.Random(f"{syntax} {tool.name}")
    for _ in range(NUM_WALKS):
        grammar = backend.make_grammar(compiled)
        text = backend.tokenizer.decode(_walk(backend, grammar, rng))
        assert grammar.is_terminated() or grammar.accept_tokens([backend.stop_token_ids[0]]), repr(text)
        content, calls = spec.call_syntax.parse(text)
        assert content == "" and [name for name, _ in calls] == [tool.name], text
        arguments = json.loads(calls[0][1])
        assert not list(check.iter_errors(arguments)), (text, arguments)
        assert spec.call_syntax.parse(spec.call_syntax.render([(tool.name, arguments)]))[1] == [
            (tool.name, json.dumps(arguments, ensure_ascii=False))]


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_qwen3_coder_constraint_holds_required_parameters_and_typed_values(backend_name):
    from grammar_factories import accepts
    backend = make_backend() if backend_name == "xgrammar" else make_llguidance_backend()
    spec = ToolCalls(TOOLS, "required", syntax="qwen3_coder")
    compiled = backend.compile(Constraint("tool_calls", spec.to_spec(), strict=False))
    syntax = spec.call_syntax

    def takes(text: str) -> bool:
        grammar = backend.make_grammar(compiled)
        encoded = backend.tokenizer.encode(text, add_special_tokens=False)
        return grammar.accept_tokens(encoded) and (grammar.is_terminated()
                                                   or grammar.accept_tokens([backend.stop_token_ids[0]]))
    assert backend_name != "xgrammar" or accepts(compiled, syntax.render([("now", {})]))
    assert takes(syntax.render([("get_weather", {"city": "Paris <3\nor Oslo", "days": 3})]))
    assert takes(syntax.render([("get_weather", {"city": "Oslo"}), ("search", {"query": "x", "exact": True})]))
    assert not takes(syntax.render([("get_weather", {"days": 3})]))  # city is required
    assert not takes(syntax.render([("get_weather", {"city": "Oslo", "days": 30})]))  # maximum
    assert not takes(syntax.render([("get_weather", {"city": "Oslo", "unit": "kelvin"})]))
    assert not takes(syntax.render([("get_weather", {"city": "Oslo", "wind": 3})]))  # not a property
    assert not takes(syntax.render([("search", {"query": "x", "exact": "yes"})]))  # a boolean, as JSON
    assert not takes(syntax.render([("edit_file", {"path": "a.txt", "old": "x", "new": "y"})]))  # pattern
    assert not takes(syntax.render([("edit_file", {"path": "a.py", "old": "x" * 17, "new": "y"})]))  # maxLength
    assert not takes("Sure. " + syntax.render([("now", {})]))  # only calls


def test_qwen3_coder_reports_its_narrowings_and_refuses_unenforced_keywords_when_strict():
    backend = make_backend()
    spec = ToolCalls(TOOLS, "named", "edit_file", syntax="qwen3_coder")
    compiled = backend.compile(Constraint("tool_calls", spec.to_spec(), strict=False))
    assert compiled.not_enforced == ['tool "edit_file": parameter "path": the pattern matches the whole value',
                                     'tool "edit_file": parameter "old": a string with minLength / maxLength is '
                                     'written on one line']
    loose = Tool("pick", "", {"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 1})
    named = ToolCalls((loose,), "named", "pick", syntax="qwen3_coder").to_spec()
    with pytest.raises(GrammarError, match=r'tools\[0\] "pick" parameters: minProperties of the parameters object'):
        backend.compile(Constraint("tool_calls", named))
    assert backend.compile(Constraint("tool_calls", named, strict=False)).not_enforced == [
        'tool "pick": minProperties of the parameters object']


def test_auto_is_free_text_until_the_call_begins():
    from grammar_factories import accepts
    spec = ToolCalls(TOOLS, "auto", syntax="qwen3_coder")
    compiled = make_backend().compile(Constraint("tool_calls", spec.to_spec(), strict=False))
    call = spec.call_syntax.render([("get_weather", {"city": "Oslo"})])
    assert accepts(compiled, "It is sunny.")
    assert accepts(compiled, "Let me look.\n" + call)
    assert not accepts(compiled, "Let me look.\n" + call.replace("<parameter=city>", "<parameter=town>"))
    assert SYNTAXES["qwen3_coder"].trigger == "<tool_call>"


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_pythonic_constraint_holds_required_parameters_and_python_constants(backend_name):
    backend = make_backend() if backend_name == "xgrammar" else make_llguidance_backend()
    spec = ToolCalls(TOOLS, "required", syntax="pythonic")
    compiled = backend.compile(Constraint("tool_calls", spec.to_spec(), strict=False))

    def takes(text: str) -> bool:
        grammar = backend.make_grammar(compiled)
        encoded = backend.tokenizer.encode(text, add_special_tokens=False)
        return grammar.accept_tokens(encoded) and (grammar.is_terminated()
                                                   or grammar.accept_tokens([backend.stop_token_ids[0]]))
    assert takes('[get_weather(city="Paris", days=3), now()]')
    assert takes('[search(query="x", exact=True, tags=["a"])]')
    assert takes('[book(room="blue", at={"day": 1, "hour": 9})]')
    assert not takes('[search(query="x", exact=true)]')  # a top-level boolean is Python's
    assert not takes('[get_weather(days=3)]')  # city is required
    assert not takes('[get_weather(city="Oslo", days=30)]')  # maximum
    assert not takes('[get_weather(city="Oslo", wind=3)]')  # not a property
    assert not takes('[get_weather(city="Oslo", city="Oslo")]')
    assert not takes('Sure. [now()]')  # only calls
    auto = backend.compile(Constraint("tool_calls", ToolCalls(TOOLS, "auto", syntax="pythonic").to_spec(),
                                      strict=False))
    grammar = backend.make_grammar(auto)
    assert grammar.accept_tokens(backend.tokenizer.encode("It is sunny.", add_special_tokens=False))


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_gemma_tool_code_is_free_text_until_the_fence_then_python_calls(backend_name):
    backend = make_backend() if backend_name == "xgrammar" else make_llguidance_backend()
    compiled = backend.compile(Constraint("tool_calls", ToolCalls(TOOLS, "auto", syntax="tool_code").to_spec(),
                                          strict=False))

    def takes(text: str) -> bool:
        grammar = backend.make_grammar(compiled)
        encoded = backend.tokenizer.encode(text, add_special_tokens=False)
        return grammar.accept_tokens(encoded) and (grammar.is_terminated()
                                                   or grammar.accept_tokens([backend.stop_token_ids[0]]))
    assert takes("It is sunny.")
    assert takes('Let me look.\n```tool_code\nget_weather(city="Paris", days=3)\nnow()\n```')
    assert not takes('```tool_code\nget_weather(days=3)\n```')  # city is required
    assert not takes('```tool_code\nprint("hi")\n```')  # not a tool
