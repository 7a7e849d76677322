#!/usr/bin/env bash
# One answer whose shape a JSON Schema fixes. The schema is written inline, as JSON, not inside a
# string (use "json_schema_text" instead to keep the order of properties).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" -d @ "$ADDR" formwork.v1.Generation/Generate <<'JSON'
{
  "chat": {"messages": [{"role": "user", "content": "Invent a person. Answer in JSON."}]},
  "max_tokens": 48,
  "temperature": 0,
  "constraint": {
    "json_schema": {
      "type": "object",
      "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}
      },
      "required": ["name", "age"],
      "additionalProperties": false
    }
  }
}
JSON
