"""Which jobs a cloud server lets edge aggregators (`sporenet-edge`) join.

An edge registers with `info = {"role": "edge"}` and then answers the cloud's tasks like
any client, except that its update is the sample-weighted mean of its devices' deltas and
its sample count their total. Mean-based aggregation composes across tiers: the cloud's
weighted mean of the edges' means is the weighted mean over every device. A job whose
aggregation needs more than that is refused when the edge registers (HierarchyError,
FAILED_PRECONDITION), with the reason, so the edge stops instead of training a model that
differs from what the job promises. Asynchronous (buffered) jobs take no edges at all.

Differential privacy crosses the tiers in local mode only: the task config's `dp_local_*`
keys reach the devices through the edge unchanged, each device clips and noises its own
delta, and the cloud's ledger charges every round with q = 1 as in a one-tier local-DP
job; the edges' and the cloud's averaging is post-processing.
"""

from __future__ import annotations

from collections.abc import Mapping

from sporenet.federated.server.config import ServerConfig
from sporenet.federated.strategies import make_strategy

#: The RegisterRequest.info key and value an edge aggregator announces itself with.
ROLE_KEY = "role"
EDGE_ROLE = "edge"


def is_edge(info: Mapping[str, str]) -> bool:
    """True when a registration comes from an edge aggregator."""
    return info.get(ROLE_KEY) == EDGE_ROLE


def edge_refusal(config: ServerConfig) -> str:
    """Why the job of `config` cannot take an edge aggregator ('' when it can)."""
    if config.job.is_async:
        return (
            'the job is asynchronous (job.mode = "async"): an edge\'s update is its whole '
            "cohort's mean, so the cloud would count many devices as one buffered update and "
            "weigh them all by one staleness, and the edge's local round would hold its devices "
            "to a deadline the async job does not have; connect the devices to the cloud "
            "directly for async jobs, or run the job in sync mode with edges"
        )
    strategy = config.strategy.name
    if make_strategy(strategy, config.strategy.options).needs_individual_updates:
        return (
            f"the job's strategy {strategy!r} needs every device's update on its own (order "
            "statistics or distances), and an edge sends only its devices' weighted mean: "
            "hierarchical jobs need a mean-based strategy (fedavg, fedavgm, fedprox, fedadam, "
            "fedyogi, fedadagrad); connect the devices to the cloud directly for this strategy"
        )
    dp = config.differential_privacy
    if dp is not None and dp.mode != "local":
        return (
            f'the job uses differential privacy in mode "{dp.mode}", which clips and noises '
            "each client's update at the cloud (or shares the noise among the clients of one "
            "secure sum): an edge's update is its whole cohort's mean, so the noise and the "
            'epsilon would not be per device. Use mode = "local" for hierarchical jobs: each '
            "device clips and noises its own update before it leaves (federated/README.md, "
            "'Tiers')"
        )
    if config.secure_aggregation is not None:
        return (
            "the job runs secure aggregation among its clients, which would sum the edges' "
            "means with equal (or capped) weights instead of their devices' sample counts: "
            "run secure aggregation at the edges, among each edge's devices "
            "([secure_aggregation] in edge.toml), and the cloud job without it"
        )
    return ""
