"""A grammar that builds its token masks on first use, served: its slow first fills (each state's
mask built when a matcher first needs it) run within the request's lazy_fill_budget_ms instead of
ending it at max_fill_ms, and its closing is found through states nobody has built yet."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint

JSONSCHEMABENCH = Path(__file__).resolve().parents[2] / "bench" / "data" / "jsonschemabench"
SNOWPLOW = JSONSCHEMABENCH / "Snowplow.jsonl"
PROMPT = [{"role": "user", "content": "Give me an example as JSON."}]


def _schema(subset: str, schema_id: str) -> dict:
    for line in (JSONSCHEMABENCH / f"{subset}.jsonl").read_text().splitlines():
        item = json.loads(line)
        if item["id"] == schema_id:
            return item["schema"]
    raise LookupError(schema_id)


def test_a_sampled_answer_to_a_5590_rule_schema_completes(llm):
    # declared properties beside `additionalProperties: true`: a trie of the names, one rule a
    # node; sampled, it reaches states whose first fill took 645 ms of CPU (max_fill_ms is 100)
    schema = json.loads(SNOWPLOW.read_text().splitlines()[0])["schema"]
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=48,
                            constraint=Constraint(kind="json_schema", spec=json.dumps(schema), strict=True))
    output = llm.generate([[{"role": "user", "content": "Give me an example as JSON."}]], [params])[0]
    assert output.finish_reason != FinishReason.ERROR, output.error
    assert output.num_output_tokens > 0


def test_an_answer_whose_closing_runs_through_unbuilt_states_closes_before_max_tokens(llm):
    # 25 properties, 17 required, 10 with a word-count pattern `^(?:\S+\s+){0,99}\S+$` (one
    # automaton state per count: compiled lazily); its closing is about 140 tokens through states
    # whose first fills took 0.1-0.7 s of CPU in all, where the search's own limit is 20 ms
    schema = _schema("Github_hard", "o21076")
    params = SamplingParams(temperature=0.0, max_tokens=180,
                            constraint=Constraint(kind="json_schema", spec=json.dumps(schema), strict=True))
    output = llm.generate([PROMPT], [params])[0]
    assert output.finish_reason == FinishReason.STOP, (output.finish_reason, output.text[-80:])
    assert output.closed_early == "budget"
    jsonschema.validate(json.loads(output.text), schema)
