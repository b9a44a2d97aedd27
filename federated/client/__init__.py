"""The client side: `Client` registers, trains with the caller's functions and uploads.

`client.py` is the task loop; `session_stream.py` the one gRPC stream it talks over.
"""

from sporenet.federated.client.client import Client

__all__ = ["Client"]
