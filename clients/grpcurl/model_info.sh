#!/usr/bin/env bash
# The model, the server's limits, and its live load (running / waiting requests, free KV blocks).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" "$ADDR" formwork.v1.Generation/GetModelInfo
