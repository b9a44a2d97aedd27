"""sporenet.cloud"""
