"""The `sporenet-server` daemon: configuration, durable round state, gRPC transport."""
