# Sourced by the recipes here: where the server is, and which grpcurl to run.
#   FORMWORK_ADDR  host:port of `formwork serve` (default 127.0.0.1:50051, what `make serve` uses)
#   GRPCURL        the grpcurl binary (default: grpcurl on PATH, else the one `make setup` put in .venv/bin)
ADDR="${FORMWORK_ADDR:-127.0.0.1:50051}"
if [ -z "${GRPCURL:-}" ]; then
  if command -v grpcurl >/dev/null 2>&1; then
    GRPCURL=grpcurl
  else
    GRPCURL="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin/grpcurl"
  fi
fi
