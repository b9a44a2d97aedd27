"""The edge aggregation tier: `sporenet-edge` serves devices and joins a cloud's rounds.

Downstream it is the server's round machinery (devices use the unchanged Client SDK);
upstream it is one participant of the cloud's job that sends its cohort's weighted mean
delta with the cohort's total sample count (federated/README.md, "Tiers").
"""
