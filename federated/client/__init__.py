"""The client side: `Client` registers, trains with the caller's functions and uploads.

`client.py` is the task loop; `transfers.py` moves its models and updates over the one
gRPC stream of `session_stream.py`; `dp.py` clips and noises updates; `failover.py`
retries and moves between server addresses; `secure.py` answers secure-aggregation rounds.
"""

from sporenet.federated.client.client import Client

__all__ = ["Client"]
