"""What the server records about its requests and its engine: Prometheus metrics, OpenTelemetry
traces and one log line per request, behind Telemetry (the only module the rest of the service calls)."""
