"""Infrastructure for long-running loops: the bounded-frequency sync runner, the metrics
registry and the HTTP server for health and metrics; `flows`, the bounded ring of flow
records (`netagent flows`)."""
