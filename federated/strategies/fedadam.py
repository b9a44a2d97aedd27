"""FedAdam: Adam on the server over the mean client delta."""

from sporenet.federated.strategies.fedopt import FedOpt


class FedAdam(FedOpt):
    """Adaptive server step with Adam moments and bias correction."""

    name = "fedadam"
    kind = "adam"
