"""Configuration is validated when built, and errors name the parameter."""

import pytest

from sporenet.federated.secagg import RoundParams, SecAggConfig, SecAggConfigError
from sporenet.federated.secagg.config import default_num_neighbours


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"num_neighbours": 5}, "`num_neighbours` must be even"),
        ({"num_neighbours": 0}, "`num_neighbours`"),
        ({"num_neighbours": 10, "threshold": 5}, "`threshold` must be greater than"),
        ({"num_neighbours": 10, "threshold": 11}, "`threshold` must be at most"),
        ({"clipping_range": 0.0}, "`clipping_range`"),
        ({"clipping_range": float("inf")}, "`clipping_range`"),
        ({"modulus_bits": 65}, "`modulus_bits`"),
        ({"modulus_bits": 32, "quantization_bits": 32}, "`quantization_bits`"),
        ({"enabled": 1}, "`enabled`"),
    ],
)
def test_bad_settings_fail_at_construction_naming_the_parameter(kwargs, names) -> None:
    with pytest.raises(SecAggConfigError, match=names):
        SecAggConfig(**kwargs)


def test_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        SecAggConfig(True, 4)  # type: ignore[misc]


def test_resolve_checks_the_ring_can_hold_the_sum() -> None:
    with pytest.raises(SecAggConfigError, match="needs modulus_bits >= 34"):
        SecAggConfig(quantization_bits=24, modulus_bits=32).resolve(1000)
    p = SecAggConfig().resolve(1000)
    assert p.quantization_bits == 32 - 10
    assert p.num_clients * (2 ** (p.quantization_bits - 1) - 1) < 2**31


def test_defaults_grow_logarithmically_and_keep_a_majority_threshold() -> None:
    assert [default_num_neighbours(n) for n in (10, 100, 1000)] == [10, 20, 30]
    small = SecAggConfig().resolve(5)
    assert small.num_neighbours == 4 and small.threshold == 3  # complete graph
    big = SecAggConfig().resolve(1000)
    assert big.num_neighbours == 30 and big.threshold == 16


def test_round_params_round_trip_and_revalidate() -> None:
    p = SecAggConfig().resolve(100)
    assert RoundParams.from_dict(p.to_dict()) == p
    bad = p.to_dict() | {"threshold": 2}
    with pytest.raises(SecAggConfigError, match="`threshold`"):
        RoundParams.from_dict(bad)
    with pytest.raises(SecAggConfigError, match="incomplete"):
        RoundParams.from_dict({"num_clients": 3})
