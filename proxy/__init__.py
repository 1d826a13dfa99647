"""The service proxy (kube-proxy replacement): model, trackers and backends."""
