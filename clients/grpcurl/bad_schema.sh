#!/usr/bin/env bash
# A schema that does not compile: INVALID_ARGUMENT with the compiler's message and a
# google.rpc.BadRequest naming the field. grpcurl prints the error and exits non-zero.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" -d '{
  "prompt": "hi",
  "max_tokens": 8,
  "constraint": {"json_schema": {"type": "object", "properties": {"age": {"type": "nonsense"}}}}
}' "$ADDR" formwork.v1.Generation/Generate
