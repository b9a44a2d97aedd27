"""FedAdagrad: Adagrad's accumulated second moment on the server."""

from sporenet.federated.strategies.fedopt import FedOpt


class FedAdagrad(FedOpt):
    """Adaptive server step with accumulated squared pseudo-gradients (beta1 = 0 by default)."""

    name = "fedadagrad"
    kind = "adagrad"

    def __init__(
        self, *, eta: float = 0.1, beta1: float = 0.0, beta2: float = 0.99, tau: float = 1e-9
    ) -> None:
        super().__init__(eta=eta, beta1=beta1, beta2=beta2, tau=tau)
