"""sporenet.federated"""
