"""The Envoy contract: the ext_proc gRPC service, its protobuf replies, request bodies, the router's headers, the rendered Envoy config."""
