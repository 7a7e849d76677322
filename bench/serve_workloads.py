"""The workloads of `formwork bench serve`, as RequestSpecs, and how their answers are scored.

* json-extraction: short texts plus a fixed-key schema to fill (bench/workloads/json_extraction.jsonl);
* mixed-schemas: real-world schemas from the JSONSchemaBench sample in bench/data/ (or `--data`) with a generic
  "produce an example" prompt that shows the schema;
* unconstrained: the json-extraction prompts without a constraint (their answers are still
  checked against the schema, which shows what the constraint buys);
* tool-calls: the first dozen function-calling requests of bench/data/function_calls.jsonl (a dozen
  distinct tools; the whole file is `formwork bench accuracy`'s set), each offered
  every tool, tool_choice required, or auto (unconstrained: the same tools shown, tool_choice none);
  an answer is valid when it is calls only (Hermes syntax, or the calls a chat stream delivered),
  each of an offered tool whose schema its arguments match (jump-forward is the server's default in
  both constrained modes: a request's tools carry no constraint options).
"""
from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass

from bench.datasets import DATA_DIR
from bench.request_record import RequestRecord
from bench.serve import RequestSpec
from bench.workloads import extraction_prompt, load_json_extraction

WORKLOADS = ("json-extraction", "mixed-schemas", "unconstrained", "tool-calls")
MIXED_SUBSETS = ("Github_easy", "Github_medium", "Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow")
EXAMPLE_SYSTEM = "You write realistic example JSON documents. Reply with the JSON document only."


def example_prompt(schema: dict) -> list[dict]:
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return [{"role": "system", "content": EXAMPLE_SYSTEM},
            {"role": "user", "content": f"JSON Schema:\n{text}\n\nProduce one example JSON document for this schema."}]


def json_extraction(max_tokens: int, jump_forward: bool | None = None, constrained: bool = True) -> list[RequestSpec]:
    specs = []
    for item in load_json_extraction():
        specs.append(RequestSpec(
            request_id=item["id"], messages=extraction_prompt(item), max_tokens=max_tokens,
            schema=item["schema"] if constrained else None, jump_forward=jump_forward if constrained else None,
            expected=item["expected"], check_schema=item["schema"]))
    return specs


def mixed_schemas(max_tokens: int, limit: int = 64, max_schema_chars: int = 1500, seed: int = 0,
                  jump_forward: bool | None = None, title: str | None = None,
                  constrained: bool = True, data: str | None = None) -> list[RequestSpec]:
    """Up to `limit` small schemas drawn (seeded) from several JSONSchemaBench subsets (the
    carried sample, or the folder `data`).

    `title` is written into every schema's constraint (not its prompt): a different title makes
    each a schema the server has never compiled (its cache is keyed by the schema text) behind the
    same prompt, for the new-schema burst."""
    from bench.coverage import load_schemas
    pool = [(subset, sid, schema) for subset, sid, schema in load_schemas(list(MIXED_SUBSETS), 200, data=data)
            if isinstance(schema, dict) and len(json.dumps(schema)) <= max_schema_chars]
    random.Random(seed).shuffle(pool)
    specs = []
    for subset, sid, schema in pool[:limit]:
        messages = example_prompt(schema)  # the prompt shows the schema without the title
        if title is not None:
            schema = {**schema, "title": title}
        specs.append(RequestSpec(request_id=f"{subset}/{sid}", messages=messages, max_tokens=max_tokens,
                                 schema=schema if constrained else None,
                                 jump_forward=jump_forward if constrained else None, check_schema=schema))
    return specs


TOOL_CHOICES = ("required", "auto")
# Every request is offered every tool, so its prompt grows with the item count: the workload takes
# the first dozen items (a dozen distinct tools), not the whole accuracy set.
NUM_TOOL_CALL_ITEMS = 12


def tool_calls(max_tokens: int, constrained: bool = True, tool_choice: str = "required") -> list[RequestSpec]:
    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"unknown tool choice {tool_choice!r}; expected one of {', '.join(TOOL_CHOICES)}")
    with open(DATA_DIR / "function_calls.jsonl", encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()][:NUM_TOOL_CALL_ITEMS]
    tools = [item["tool"] for item in items]
    return [RequestSpec(request_id=item["id"], messages=[{"role": "user", "content": item["request"]}],
                        max_tokens=max_tokens, tools=tools, tool_choice=tool_choice if constrained else "none",
                        expected=item["expected"], expected_tool=item["tool"]["name"]) for item in items]


def build(workload: str, max_tokens: int, constrained: bool = True, jump_forward: bool | None = None,
          data: str | None = None, tool_choice: str = "required") -> list[RequestSpec]:
    """The workload's requests; `unconstrained` is json-extraction's prompts without their schema
    (as is any workload with constrained=False); `tool_choice`: tool-calls' constrained choice."""
    if workload in ("json-extraction", "unconstrained"):
        return json_extraction(max_tokens, jump_forward, constrained=constrained and workload != "unconstrained")
    if workload == "mixed-schemas":
        return mixed_schemas(max_tokens, jump_forward=jump_forward, constrained=constrained, data=data)
    if workload == "tool-calls":
        return tool_calls(max_tokens, constrained, tool_choice)
    raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")


def _field_accuracy(expected: dict, got: object) -> float:
    if not isinstance(got, dict):
        return 0.0
    return sum(1 for k in expected if got.get(k) == expected[k]) / max(len(expected), 1)


def score(spec: RequestSpec, text: str, finish_reason: str,
          calls: list[tuple[str, str]] | None = None) -> tuple[bool, float | None]:
    """(valid, field accuracy): valid means the answer parses, validates against the schema and
    was not cut by max_tokens; field accuracy only for items with an expected answer. A tool-call
    answer's `calls` are the ones its server parsed (then `text` is the rest), else read from `text`."""
    import jsonschema
    if spec.tools is not None:
        outcome = tool_call_outcome(spec, text, calls)
        accuracy = _field_accuracy(spec.expected, outcome.arguments.get(spec.expected_tool)) if spec.expected else None
        return outcome.valid and finish_reason != "length", accuracy
    schema = spec.check_schema
    try:
        value = json.loads(text)
        if schema is not None:
            validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            validator(schema).validate(value)
        valid = finish_reason != "length"
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError, RecursionError):
        value, valid = None, False
    accuracy = _field_accuracy(spec.expected, value) if spec.expected is not None else None
    return valid, accuracy


@dataclass(frozen=True)
class ToolCallOutcome:
    """How one answer's calls fare against the request's tools."""

    num_calls: int
    num_parsed: int  # calls whose arguments are a JSON object
    num_schema_valid: int  # calls of an offered tool whose arguments that tool's schema accepts
    only_calls: bool  # no text beside the calls
    arguments: dict[str, object]  # tool name -> the parsed arguments of its first call

    @property
    def valid(self) -> bool:
        """At least one call, every call valid, nothing else (max_tokens aside)."""
        return self.num_calls > 0 and self.num_schema_valid == self.num_calls and self.only_calls


def tool_call_outcome(spec: RequestSpec, text: str, calls: list[tuple[str, str]] | None = None) -> ToolCallOutcome:
    """The answer's calls: `calls` as a server parsed them (`text` the rest), else the Hermes-syntax
    calls in `text`, where a call begun and not closed (cut by max_tokens) counts as a call whose
    arguments do not parse, as a chat stream would have delivered it."""
    import jsonschema

    from grammar.chat.tool_calls import SYNTAXES
    schemas = {t["name"]: t["parameters"] for t in spec.tools or []}
    if calls is None:
        content, calls, broken = SYNTAXES["hermes"].scan(text)
        if broken is not None:  # the scan keeps the unfinished call as the end of the text
            content = content[:len(content) - (len(text) - broken)]
            calls = [*calls, ("", text[broken:])]
    else:
        content = text
    content = content.strip()
    num_parsed = num_schema_valid = 0
    arguments: dict[str, object] = {}
    for name, arguments_text in calls:
        try:
            value = json.loads(arguments_text)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        num_parsed += 1
        arguments.setdefault(name, value)
        if name in schemas:
            try:
                jsonschema.validate(value, schemas[name])
                num_schema_valid += 1
            except (jsonschema.ValidationError, jsonschema.SchemaError):
                pass
    return ToolCallOutcome(len(calls), num_parsed, num_schema_valid, not content, arguments)


def score_records(specs: dict[str, RequestSpec], records: list[RequestRecord]) -> dict:
    """Valid, length-capped and finished-but-invalid counts, and mean field accuracy, over the
    records that succeeded; for tool calls also how many calls the answers made and how they fared."""
    valid, capped, finished_invalid, accuracy, invalid, per_request = 0, 0, 0, [], [], []
    outcomes: list[ToolCallOutcome] = []
    for record in records:
        if not record.ok:
            continue
        spec = specs[record.request_id.rsplit("#", 1)[0]]
        ok, acc = score(spec, record.text, record.finish_reason, record.tool_calls)
        per_request.append([spec.request_id, record.finish_reason, ok, record.num_output_tokens])
        valid += ok
        finished_invalid += not ok and record.finish_reason != "length"
        if not ok and len(invalid) < 3:
            calls = f" calls {record.tool_calls}" if record.tool_calls else ""
            invalid.append(f"{record.request_id} ({record.finish_reason}): {record.text[:300]}{calls[:300]}")
        capped += record.finish_reason == "length"
        if acc is not None:
            accuracy.append(acc)
        if spec.tools is not None:
            outcomes.append(tool_call_outcome(spec, record.text, record.tool_calls))
    # num_finished_invalid: answers that ended (not cut by max_tokens) and still do not validate;
    # requests: [item id, finish reason, valid, output tokens] per request
    summary = {"num_valid": valid, "num_length_capped": capped, "num_finished_invalid": finished_invalid,
               "invalid_samples": invalid, "requests": per_request,
               "field_accuracy": statistics.mean(accuracy) if accuracy else None}
    if outcomes:
        summary["tool_calls"] = tool_call_summary(outcomes)
    return summary


def tool_call_summary(outcomes: list[ToolCallOutcome]) -> dict:
    """Over the answers of one run: calls per answer, and how many calls parsed and validated."""
    per_answer: dict[int, int] = {}
    for o in outcomes:
        per_answer[o.num_calls] = per_answer.get(o.num_calls, 0) + 1
    # num_answers_arguments_parse: answers with calls, every one's arguments a JSON object;
    # calls_per_answer: number of calls -> number of answers with that many
    return {"num_answers": len(outcomes), "calls_per_answer": dict(sorted(per_answer.items())),
            "mean_calls_per_answer": sum(o.num_calls for o in outcomes) / len(outcomes),
            "num_calls": sum(o.num_calls for o in outcomes),
            "num_calls_parsed": sum(o.num_parsed for o in outcomes),
            "num_calls_schema_valid": sum(o.num_schema_valid for o in outcomes),
            "num_answers_arguments_parse": sum(o.num_calls > 0 and o.num_parsed == o.num_calls for o in outcomes),
            "num_answers_with_text": sum(not o.only_calls for o in outcomes)}
