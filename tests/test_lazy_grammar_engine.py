"""A grammar that builds its token masks on first use, served: its slow first fills (each state's
mask built when a matcher first needs it) run within the request's lazy_fill_budget_ms instead of
ending it at max_fill_ms."""
from __future__ import annotations

import json
from pathlib import Path

from engine.protocol import FinishReason
from engine.sampling_params import SamplingParams
from grammar.constraint import Constraint

SNOWPLOW = Path(__file__).resolve().parents[1] / "bench" / "data" / "jsonschemabench" / "Snowplow.jsonl"


def test_a_sampled_answer_to_a_5590_rule_schema_completes(llm):
    # declared properties beside `additionalProperties: true`: a trie of the names, one rule a
    # node; sampled, it reaches states whose first fill took 645 ms of CPU (max_fill_ms is 100)
    schema = json.loads(SNOWPLOW.read_text().splitlines()[0])["schema"]
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=48,
                            constraint=Constraint(kind="json_schema", spec=json.dumps(schema), strict=True))
    output = llm.generate([[{"role": "user", "content": "Give me an example as JSON."}]], [params])[0]
    assert output.finish_reason != FinishReason.ERROR, output.error
    assert output.num_output_tokens > 0
