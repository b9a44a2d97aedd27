"""FedYogi: Yogi's additive second-moment update on the server."""

from sporenet.federated.strategies.fedopt import FedOpt


class FedYogi(FedOpt):
    """Adaptive server step whose second moment changes by at most (1-beta2)·Δ² per round."""

    name = "fedyogi"
    kind = "yogi"
