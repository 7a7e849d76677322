# Sourced by the recipes here: where the server is, how to reach it, and which grpcurl to run.
#   FORMWORK_ADDR     host:port of `formwork serve` (default 127.0.0.1:50051, what `make serve` uses)
#   FORMWORK_TLS_CA   a PEM CA to trust: TLS (else plaintext); FORMWORK_TLS=1: TLS with the system's CAs
#   FORMWORK_API_KEY  sent as `authorization: Bearer KEY` (also to reflection)
#   GRPCURL           the grpcurl binary (default: grpcurl on PATH, else the one `make setup` put in .venv/bin)
ADDR="${FORMWORK_ADDR:-127.0.0.1:50051}"
if [ -n "${FORMWORK_TLS_CA:-}" ]; then
  GRPCURL_FLAGS=(-cacert "$FORMWORK_TLS_CA")
elif [ -n "${FORMWORK_TLS:-}" ]; then
  GRPCURL_FLAGS=()
else
  GRPCURL_FLAGS=(-plaintext)
fi
if [ -n "${FORMWORK_API_KEY:-}" ]; then
  GRPCURL_FLAGS+=(-H "authorization: Bearer $FORMWORK_API_KEY")
fi
if [ -z "${GRPCURL:-}" ]; then
  if command -v grpcurl >/dev/null 2>&1; then
    GRPCURL=grpcurl
  else
    GRPCURL="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin/grpcurl"
  fi
fi
