"""Generated hostile requests, with good ones interleaved, for the fuzz suite (tests/integration/test_fuzz.py).

`generate_cases(seed)` yields an endless, reproducible stream of Cases: floats out of range,
invalid UTF-8 in every string field of every method, garbage bytes, grammar bombs, malformed
schemas and plain field errors, and one good constrained request in every few whose output is
checked against its constraint. `run_fuzz` sends them in concurrent batches to a live server
until a time budget is spent, and counts the answers by status code.
"""
from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from google.protobuf import json_format

from service._gen.formwork.v1 import generation_pb2 as pb

PLACEHOLDER = "FUZZ-PLACEHOLDER"  # replaced by invalid UTF-8 of the same length in the serialized bytes
RESPONSE_TYPES = {"Generate": pb.GenerateResponse, "GenerateStream": pb.GenerateResponse,
                  "Tokenize": pb.TokenizeResponse, "ValidateConstraint": pb.ValidateConstraintResponse}
CALL_TIMEOUT_S = 120.0  # past this a call counts as a hang

RECURSIVE_SCHEMA = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}},
                    "required": ["child"]}
# constraints a server must refuse (INVALID_ARGUMENT, or ok=false from ValidateConstraint)
BOMBS: dict[str, dict] = {
    "regex-huge-count": {"regex": "a{99999999999}"},
    "regex-wrapping-count": {"regex": "a{4294967297}"},
    "regex-nested-counts": {"regex": "(a{1000}){1000}"},
    "regex-wide-count": {"regex": "[a-z]{0,99999999}"},
    "regex-ambiguous-repeat": {"regex": r"(\w+ ?){1,50}"},
    "regex-nested-variable-repeat": {"regex": "([a-z]{1,3}){0,1000}"},
    "regex-deep-parens": {"regex": "(" * 5000 + "a" + ")" * 5000},
    "regex-unbalanced": {"regex": "a(b"},
    "schema-recursive-required": {"json_schema_text": json.dumps(RECURSIVE_SCHEMA)},
    "schema-recursive-inner": {"json_schema_text": json.dumps(
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"$ref": "#/properties/a"}},
                                                "required": ["b"]}}})},
    "schema-pattern-nested-counts": {"json_schema": {"type": "string", "pattern": "(a{1000}){1000}"}},
    "schema-pattern-huge-count": {"json_schema_text": '{"type": "string", "pattern": "x{99999999999}"}'},
    "schema-min-length": {"json_schema": {"type": "string", "minLength": 1000000}},
    "schema-min-items": {"json_schema": {"type": "array", "items": {"const": "x"}, "minItems": 1000000}},
    "schema-max-length-negative": {"json_schema": {"type": "string", "maxLength": -1}},
    "schema-pattern-not-string": {"json_schema": {"pattern": 5}},
    "schema-type-nonsense": {"json_schema": {"type": "nonsense"}},
    "schema-enum-not-list": {"json_schema": {"enum": "abc"}},
    "schema-text-deep-1000": {"json_schema_text": '{"items":' * 1000 + "{}" + "}" * 1000},
    "schema-text-deep-brackets": {"json_schema_text": "[" * 100000},
    "schema-text-not-json": {"json_schema_text": "{not json"},
    "schema-struct-deep-40": {"json_schema": "STRUCT-40"},
    "ebnf-endless": {"grammar": 'root ::= "a" root'},
    "ebnf-dead-branch": {"grammar": 'root ::= "x" | "a" r\nr ::= "b" r'},
    "ebnf-undefined": {"grammar": "root ::= undefined_rule"},
    "choice-empty-string": {"choice": {"choices": ["yes", ""]}},
    "regex-empty": {"regex": "   "},
}
# the bombs llguidance compiles (lazily: every fill stays cheap, the request runs to its max_tokens);
# xgrammar refuses them, and llguidance refuses the rest
LLGUIDANCE_TAKES = {"ebnf-dead-branch", "ebnf-endless", "regex-ambiguous-repeat", "regex-nested-variable-repeat",
                    "schema-recursive-inner"}
# of those, the ones auto takes too: xgrammar refuses them only for their slow fills, so auto moves
# them to llguidance (the others never end, which xgrammar's refusal under auto keeps out)
AUTO_TAKES = {"regex-ambiguous-repeat", "regex-nested-variable-repeat"}
# a request's grammar_backend: unset (the server's, auto) or each backend by name
GRAMMAR_BACKENDS = [None, "GRAMMAR_BACKEND_AUTO", "GRAMMAR_BACKEND_XGRAMMAR", "GRAMMAR_BACKEND_LLGUIDANCE"]

_BAD_FLOATS = {
    "temperature": [1e100, 1e300, -1.0, 101.0, 1e10, float("nan"), float("inf")],
    "top_p": [0.0, 1.5, -1.0, 1e100, float("nan")],
    "min_p": [-0.1, 2.0, 1e300, float("-inf")],
    "repetition_penalty": [0.0, -1.0, 1e-300, 5e-324, 1e100, float("inf")],
    "frequency_penalty": [3.0, -1e100, float("nan")],
    "presence_penalty": [-3.0, 1e300, float("inf")],
}
_UTF8_FIELDS = {  # method -> fields that can carry a bad string, as a request dict with the placeholder
    "Generate": ["prompt", "request_id", "role", "content", "stop", "regex", "json_schema_text", "grammar",
                 "choice", "json_schema"],
    "GenerateStream": ["prompt", "content", "regex"],
    "Tokenize": ["prompt", "role", "content"],
    "ValidateConstraint": ["regex", "json_schema_text", "grammar", "choice", "json_schema"],
}
_UTF8_EXPECTED_FIELD = {
    "prompt": "prompt", "request_id": "request_id", "role": "chat.messages[0].role",
    "content": "chat.messages[0].content", "stop": "stop[1]", "regex": "constraint.regex",
    "json_schema_text": "constraint.json_schema_text", "grammar": "constraint.grammar",
    "choice": "constraint.choice.choices[1]", "json_schema": "constraint.json_schema",
}

GOOD_CONSTRAINTS: list[tuple[dict, Callable[[str], bool]]] = [
    ({"choice": {"choices": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"regex": "[a-z]{2,6}"}, lambda t: re.fullmatch("[a-z]{2,6}", t) is not None),
    ({"grammar": 'root ::= "answer: " ("red" | "green" | "blue")'},
     lambda t: t in ("answer: red", "answer: green", "answer: blue")),
    ({"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                      "additionalProperties": False}},
     lambda t: isinstance(json.loads(t).get("ok"), bool)),
]
_PROMPTS = ["Is the sky blue?", "Name a color.", "Say something short.", "Answer yes or no: is water wet?"]


@dataclass
class Case:
    name: str  # what the case tries, e.g. "float:temperature=1e+100"
    method: str
    payload: bytes  # the request as sent (may not decode)
    good: bool = False  # a valid request whose output is checked
    check: Callable[[str], bool] | None = None  # good requests: the output text is valid
    field: str | None = None  # bad requests: the field the INVALID_ARGUMENT must name
    may_succeed: bool = False  # garbage that may happen to decode into a valid request


@dataclass
class Outcome:
    case: Case
    code: str  # grpc status name, "OK", or "HANG"
    message: str = ""
    problem: str | None = None  # why the answer is wrong, if it is


@dataclass
class FuzzReport:
    num_sent: int = 0
    codes: Counter = field(default_factory=Counter)  # status name -> count
    kinds: Counter = field(default_factory=Counter)  # case kind ("bomb", "utf8", ...) -> count
    backends: Counter = field(default_factory=Counter)  # good and bomb cases: grammar backend asked for -> count
    num_good: int = 0
    num_good_valid: int = 0
    problems: list[str] = field(default_factory=list)
    num_batches: int = 0
    elapsed_s: float = 0.0

    def summary(self) -> dict:
        return {"sent": self.num_sent, "by_status": dict(sorted(self.codes.items())),
                "by_kind": dict(sorted(self.kinds.items())), "by_backend": dict(sorted(self.backends.items())),
                "good": self.num_good,
                "good_valid": self.num_good_valid, "batches": self.num_batches,
                "problems": self.problems[:20], "elapsed_s": round(self.elapsed_s, 1)}


# ---- building requests ------------------------------------------------------------------------


def _chat(text: str) -> dict:
    return {"chat": {"messages": [{"role": "user", "content": text}]}}


def _deep_struct(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _serialize(method: str, fields: dict) -> bytes:
    message_type = {"Generate": pb.GenerateRequest, "GenerateStream": pb.GenerateRequest,
                    "Tokenize": pb.TokenizeRequest, "ValidateConstraint": pb.ValidateConstraintRequest}[method]
    constraint = fields.get("constraint", {})
    if constraint.get("json_schema") == "STRUCT-40":  # deeper than json_format will build
        fields = {**fields, "constraint": {"json_schema": {}}}
        message = json_format.ParseDict(fields, message_type())
        message.constraint.json_schema.CopyFrom(_struct(_deep_struct(40)))
        return message.SerializeToString()
    return json_format.ParseDict(fields, message_type()).SerializeToString()


def _struct(value: dict):
    """A Struct built bottom-up (json_format recurses and stops at 100 levels)."""
    from google.protobuf import struct_pb2
    chain = []
    node = value
    while isinstance(node, dict) and "properties" in node:
        chain.append(node)
        node = node["properties"]["a"]
    inner = struct_pb2.Struct()
    inner.update(node)
    for outer in reversed(chain):
        struct = struct_pb2.Struct()
        struct.update({k: v for k, v in outer.items() if k != "properties"})
        properties = struct_pb2.Struct()
        properties.fields["a"].struct_value.CopyFrom(inner)
        struct.fields["properties"].struct_value.CopyFrom(properties)
        inner = struct
    return inner


def _with_bad_utf8(data: bytes, rng: random.Random) -> bytes:
    placeholder = PLACEHOLDER.encode()
    index = data.index(placeholder)
    bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
    bad = (bad * len(placeholder))[:len(placeholder)]
    return data[:index] + bad + data[index + len(placeholder):]


# ---- the generators ---------------------------------------------------------------------------


def _on_backend(constraint: dict, rng: random.Random) -> tuple[dict, str]:
    """The constraint with a grammar_backend drawn from GRAMMAR_BACKENDS, and the name's suffix for it."""
    backend = rng.choice(GRAMMAR_BACKENDS)
    if backend is None:
        return constraint, ""
    return {**constraint, "grammar_backend": backend}, "@" + backend.removeprefix("GRAMMAR_BACKEND_").lower()


def _good(rng: random.Random) -> Case:
    constraint, check = rng.choice(GOOD_CONSTRAINTS)
    kind = next(iter(constraint))
    constraint, on = _on_backend(constraint, rng)
    fields = {**_chat(rng.choice(_PROMPTS)), "max_tokens": 24, "constraint": constraint,
              "temperature": rng.choice([0.0, 0.7, 1.3]), "seed": rng.choice([-2**63, 0, 7, 2**63 - 1])}
    method = rng.choice(["Generate", "GenerateStream"])
    return Case(f"good:{kind}{on}", method, _serialize(method, fields), good=True, check=check)


def _bad_float(rng: random.Random) -> Case:
    name = rng.choice(sorted(_BAD_FLOATS))
    value = rng.choice(_BAD_FLOATS[name])
    fields = {**_chat("hi"), "max_tokens": 4}
    if rng.random() < 0.7:
        fields["constraint"] = rng.choice(GOOD_CONSTRAINTS)[0]
    message = json_format.ParseDict(fields, pb.GenerateRequest())
    setattr(message, name, value)
    return Case(f"float:{name}={value!r}", rng.choice(["Generate", "GenerateStream"]), message.SerializeToString(),
                field=name)


def _bad_utf8(rng: random.Random) -> Case:
    method = rng.choice(sorted(_UTF8_FIELDS))
    where = rng.choice(_UTF8_FIELDS[method])
    p = PLACEHOLDER
    constraint = {"regex": {"regex": p}, "json_schema_text": {"json_schema_text": json.dumps({"enum": [p]})},
                  "grammar": {"grammar": f'root ::= "{p}"'}, "choice": {"choice": {"choices": ["a", p]}},
                  "json_schema": {"json_schema": {"enum": [p]}}}
    if method == "ValidateConstraint":
        fields = {"constraint": constraint[where]}
    elif where in constraint:
        fields = {**_chat("hi"), "max_tokens": 4, "constraint": constraint[where]}
    elif where == "prompt":
        fields = {"prompt": p, "max_tokens": 4} if method != "Tokenize" else {"prompt": p}
    elif where in ("role", "content"):
        message = {"role": "user", "content": "hi", where: p}
        fields = {"chat": {"messages": [message]}}
        if method != "Tokenize":
            fields["max_tokens"] = 4
    elif where == "stop":
        fields = {**_chat("hi"), "max_tokens": 4, "stop": ["x", p]}
    else:
        fields = {**_chat("hi"), "max_tokens": 4, where: p}
    payload = _with_bad_utf8(_serialize(method, fields), rng)
    return Case(f"utf8:{method}.{where}", method, payload, field=_UTF8_EXPECTED_FIELD[where])


def _garbage(rng: random.Random) -> Case:
    method = rng.choice(sorted(RESPONSE_TYPES))
    kind = rng.random()
    if kind < 0.4:
        payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif kind < 0.7:  # a good request with bytes flipped
        payload = bytearray(_serialize(method, {"prompt": "hello there"} if method in ("Tokenize",) else
                                       {**_chat("hello"), "max_tokens": 4} if method != "ValidateConstraint" else
                                       {"constraint": {"regex": "[a-z]+"}}))
        for _ in range(rng.randrange(1, 4)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        payload = bytes(payload)
    else:  # a truncated one
        payload = _serialize(method, {**_chat("hello " * 5), "max_tokens": 4} if method in ("Generate", "GenerateStream")
                             else {"prompt": "hello"} if method == "Tokenize" else {"constraint": {"regex": "x+"}})
        payload = payload[:rng.randrange(1, len(payload))]
    return Case(f"garbage:{method}", method, payload, may_succeed=True)


def _bomb(rng: random.Random) -> Case:
    name = rng.choice(sorted(BOMBS))
    kind = next(iter(BOMBS[name]))
    constraint, on = _on_backend(BOMBS[name], rng)
    method = rng.choice(["Generate", "GenerateStream", "ValidateConstraint"])
    fields = {"constraint": constraint} if method == "ValidateConstraint" else {
        **_chat("Write something."), "max_tokens": 8, "constraint": {**constraint,
                                                                      "jump_forward": rng.random() < 0.7}}
    taken = name in LLGUIDANCE_TAKES if on == "@llguidance" else on != "@xgrammar" and name in AUTO_TAKES
    return Case(f"bomb:{name}{on}", method, _serialize(method, fields), field=f"constraint.{kind}", may_succeed=taken)


_PLAIN_BAD: list[tuple[str, dict, str]] = [
    ("empty-prompt", {"prompt": "", "max_tokens": 4}, "prompt"),
    ("no-input", {"max_tokens": 4}, "input"),
    ("max-tokens-zero", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("max-tokens-over-cap", {"prompt": "hi", "max_tokens": 100000}, "max_tokens"),
    ("token-id-out-of-range", {"prompt_token_ids": {"ids": [1, 4000000000]}, "max_tokens": 4}, "prompt_token_ids.ids"),
    ("empty-token-ids", {"prompt_token_ids": {"ids": []}, "max_tokens": 4}, None),
    ("empty-stop", {"prompt": "hi", "max_tokens": 4, "stop": ["a", ""]}, "stop"),
    ("stop-token-out-of-range", {"prompt": "hi", "max_tokens": 4, "stop_token_ids": [4000000000]}, "stop_token_ids"),
    ("logprobs-21", {"prompt": "hi", "max_tokens": 4, "logprobs": 21}, "logprobs"),
    ("long-request-id", {"prompt": "hi", "max_tokens": 4, "request_id": "r" * 300}, "request_id"),
    ("empty-chat", {"chat": {"messages": []}, "max_tokens": 4}, "chat.messages"),
    ("empty-role", {"chat": {"messages": [{"role": "", "content": "x"}]}, "max_tokens": 4}, "chat.messages[0].role"),
    ("constraint-unset", {"prompt": "hi", "max_tokens": 4, "constraint": {}}, "constraint"),
    ("prompt-too-long", {"prompt_token_ids": {"ids": [100] * 600}, "max_tokens": 4}, None),
]


def _plain(rng: random.Random) -> Case:
    name, fields, expected = rng.choice(_PLAIN_BAD)
    method = rng.choice(["Generate", "GenerateStream"])
    return Case(f"plain:{name}", method, _serialize(method, fields), field=expected)


_KINDS: list[tuple[Callable[[random.Random], Case], float]] = [
    (_good, 0.2), (_bad_float, 0.15), (_bad_utf8, 0.2), (_garbage, 0.15), (_bomb, 0.2), (_plain, 0.1)]


def generate_cases(seed: int) -> Iterator[Case]:
    """An endless stream of cases; the same seed gives the same stream."""
    rng = random.Random(seed)
    makers, weights = zip(*_KINDS)
    while True:
        yield rng.choices(makers, weights)[0](rng)


# ---- sending ----------------------------------------------------------------------------------


def send(channel: grpc.Channel, case: Case) -> Outcome:
    """Send one case as raw bytes and judge the answer."""
    path = f"/formwork.v1.Generation/{case.method}"
    response_type = RESPONSE_TYPES[case.method]
    try:
        if case.method == "GenerateStream":
            call = channel.unary_stream(path, request_serializer=None, response_deserializer=response_type.FromString)
            messages = list(call(case.payload, timeout=CALL_TIMEOUT_S))
            text = "".join(m.text for m in messages)
            finish = messages[-1].finish_reason if messages else None
            response = messages[-1] if messages else None
        else:
            call = channel.unary_unary(path, request_serializer=None, response_deserializer=response_type.FromString)
            response = call(case.payload, timeout=CALL_TIMEOUT_S)
            text = getattr(response, "text", "")
            finish = getattr(response, "finish_reason", None)
    except grpc.RpcError as e:
        code = "HANG" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else e.code().name
        return Outcome(case, code, e.details() or "", _judge_error(case, code, e.details() or ""))
    return Outcome(case, "OK", "", _judge_ok(case, response, text, finish))


def _judge_error(case: Case, code: str, message: str) -> str | None:
    if code in ("INTERNAL", "UNKNOWN", "HANG", "UNAVAILABLE"):
        return f"{case.name}: {code} {message[:200]}"
    if case.good:
        return f"{case.name}: a good request failed with {code}: {message[:200]}"
    if code == "RESOURCE_EXHAUSTED":  # the queue was full: a fair answer to any request
        return None
    if code != "INVALID_ARGUMENT":
        return f"{case.name}: {code} {message[:200]}"
    if case.field is not None and not message.startswith(case.field):
        return f"{case.name}: the message does not name {case.field}: {message[:200]}"
    if "Traceback" in message:
        return f"{case.name}: a traceback in the message"
    return None


def _judge_ok(case: Case, response, text: str, finish) -> str | None:
    if case.good:
        if finish != pb.FINISH_REASON_STOP:
            return f"{case.name}: finished with {finish}, text {text!r}"
        try:
            valid = case.check is not None and case.check(text)
        except ValueError:
            valid = False
        return None if valid else f"{case.name}: output {text!r} does not match its constraint"
    if case.may_succeed:
        return None
    if case.method == "ValidateConstraint" and case.name.startswith(("bomb:", "utf8:")):
        return None if not response.ok and response.error else f"{case.name}: ValidateConstraint said ok"
    return f"{case.name}: answered OK"


def run_fuzz(channel: grpc.Channel, seed: int, budget_s: float, batch_size: int = 24, concurrency: int = 8,
             after_batch: Callable[[], str | None] | None = None, max_cases: int | None = None) -> FuzzReport:
    """Send batches of generated cases (`concurrency` at a time) until `budget_s` is spent;
    `after_batch` returns a problem (the engine is gone, say) or None."""
    report = FuzzReport()
    cases = generate_cases(seed)
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        while time.monotonic() - start < budget_s and (max_cases is None or report.num_sent < max_cases):
            batch = [next(cases) for _ in range(batch_size)]
            for outcome in pool.map(lambda c: send(channel, c), batch):
                report.num_sent += 1
                report.codes[outcome.code] += 1
                report.kinds[outcome.case.name.split(":")[0]] += 1
                if outcome.case.name.startswith(("good:", "bomb:")):
                    report.backends[outcome.case.name.partition("@")[2] or "server's"] += 1
                if outcome.case.good:
                    report.num_good += 1
                    report.num_good_valid += outcome.problem is None
                if outcome.problem is not None:
                    report.problems.append(outcome.problem)
            report.num_batches += 1
            problem = after_batch() if after_batch is not None else None
            if problem is not None:
                report.problems.append(f"after batch {report.num_batches}: {problem}")
                break
    report.elapsed_s = time.monotonic() - start
    return report
