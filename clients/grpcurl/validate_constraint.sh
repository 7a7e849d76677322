#!/usr/bin/env bash
# Compile a constraint without generating: ok (and now cached), or the compiler's error.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" -d '{"constraint": {"regex": "[A-Z]{3}-[0-9]{4}"}}' "$ADDR" formwork.v1.Generation/ValidateConstraint
