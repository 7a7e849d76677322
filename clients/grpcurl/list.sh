#!/usr/bin/env bash
# The services, then the Generation API and its request message, read through server reflection
# (no .proto file needed).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$GRPCURL" -plaintext "$ADDR" list
"$GRPCURL" -plaintext "$ADDR" describe formwork.v1.Generation
"$GRPCURL" -plaintext "$ADDR" describe formwork.v1.GenerateRequest
