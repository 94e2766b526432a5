"""The specctl sidecar: the gRPC controller engines stream reports to, and its /metrics."""
