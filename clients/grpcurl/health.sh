#!/usr/bin/env bash
# Standard gRPC health check: SERVING once the model is loaded and warm, NOT_SERVING while loading,
# after the engine died, and while shutting down.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" "${GRPCURL_FLAGS[@]}" -d '{"service": ""}' "$ADDR" grpc.health.v1.Health/Check
