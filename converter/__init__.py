"""sporenet.converter"""
