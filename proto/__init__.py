"""Wire formats: the model IR (model.fbs) and the federated gRPC service, with bindings."""
