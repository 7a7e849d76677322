#!/usr/bin/env bash
# The services, then the Generation API and its request message, read through server reflection
# (no .proto file needed).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" "$ADDR" list
"$GRPCURL" "${GRPCURL_FLAGS[@]}" "$ADDR" describe formwork.v1.Generation
"$GRPCURL" "${GRPCURL_FLAGS[@]}" "$ADDR" describe formwork.v1.GenerateRequest
