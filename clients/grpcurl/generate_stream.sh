#!/usr/bin/env bash
# The answer as it is produced: one message per step with the new text and token ids; the last one
# carries finish_reason, usage and timings.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" -d @ "$ADDR" formwork.v1.Generation/GenerateStream <<'JSON'
{
  "prompt": "The three primary colors are",
  "max_tokens": 12,
  "temperature": 0
}
JSON
