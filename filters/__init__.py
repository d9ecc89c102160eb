"""The Envoy-facing side: the ext_proc gRPC service and its chain of request filters."""
