"""Settings that would pass a shallow start-up check and break the job in a later round
are refused when the configuration is built, naming the key as the TOML writes it."""

from __future__ import annotations

from typing import Any

import pytest

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import MAX_COHORT_CHECKED, build_config


def build(**values: Any):  # type: ignore[no-untyped-def]
    return build_config({"state_dir": "s", **values}, {})


@pytest.mark.parametrize("key", ["max_update_norm", "max_update_bytes"])
def test_zero_bounds_are_refused_not_read_as_unset(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"`{key}` must be > 0.*got 0"):
        build(**{key: 0})
    assert getattr(build(**{key: 1}), key) == 1


def test_threshold_is_checked_against_every_cohort_size_not_only_min_clients() -> None:
    # threshold 5 with the default neighbours: fine for 10 clients (k = 9), but a later
    # round selecting 11 clients gets k = 10 >= 2t and the protocol refuses it.
    table = {"enabled": True, "threshold": 5}
    with pytest.raises(ConfigError, match=r"a cohort of 11 .*10 to 1000.*secure_aggregation"):
        build(min_clients=10, secure_aggregation=table)
    # With fixed neighbours the same threshold works for every cohort size.
    config = build(min_clients=10, secure_aggregation={**table, "neighbours": 8})
    for n in (10, 50, MAX_COHORT_CHECKED):
        assert config.secure_aggregation.protocol.resolve(n).threshold == 5  # type: ignore[union-attr]


def test_the_cohort_bound_is_the_number_of_identities_when_auth_lists_them() -> None:
    table = {"enabled": True, "threshold": 5}

    def tokens(n: int) -> dict[str, str]:
        return {f"c{i}": f"token-{i}" for i in range(n)}

    build(min_clients=10, secure_aggregation=table, auth={"tokens": tokens(10)})
    with pytest.raises(ConfigError, match=r"a cohort of 11 \(rounds may select 10 to 11"):
        build(min_clients=10, secure_aggregation=table, auth={"tokens": tokens(11)})


def test_strategy_without_options_says_so() -> None:
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['mu'\]; it takes no options$"):
        build(strategy={"name": "fedavg", "mu": 0.1})


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"auth": {"max_skew": 0}}, "`auth.max_skew`"),
        (
            {"secure_aggregation": {"enabled": True, "stage_timeout": -1}},
            "`secure_aggregation.stage_timeout`",
        ),
    ],
)
def test_table_keys_are_named_as_the_toml_writes_them(values: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(**values)
