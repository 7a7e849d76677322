"""Benchmark workloads: structured-output tasks with a schema and the expected answer."""
from __future__ import annotations

import json

from bench.datasets import JSON_EXTRACTION_FILE

# Fixed for every item so that the system turn is a shared, prefix-cacheable prefix.
EXTRACTION_SYSTEM = (
    "You extract facts from text into JSON that follows the given schema. "
    "Use only information stated in the text. Write dates as YYYY-MM-DD and times as 24-hour HH:MM. "
    "Write amounts as plain numbers without currency symbols or thousands separators. "
    "Reply with the JSON object only."
)


def load_json_extraction() -> list[dict]:
    """Items of bench/data/json_extraction.jsonl: id, domain, text, schema (a parsed JSON Schema), expected."""
    items = []
    with open(JSON_EXTRACTION_FILE, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                items.append(json.loads(line))
    return items


def extraction_prompt(item: dict) -> list[dict]:
    """The chat conversation asking for the extraction of one item."""
    schema = json.dumps(item["schema"], separators=(",", ":"), ensure_ascii=False)
    user = (
        f"JSON Schema:\n{schema}\n\n"
        f"Text:\n{item['text']}\n\n"
        "Extract the facts from the text as one JSON object that follows the schema. Output the JSON only."
    )
    return [{"role": "system", "content": EXTRACTION_SYSTEM}, {"role": "user", "content": user}]
