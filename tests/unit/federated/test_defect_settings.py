"""The settings added for the defects found in use: each bad value is refused naming its key."""

from __future__ import annotations

import pytest

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import build_config


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"storage": {"keep_models": 1}}, "`keep_models` (`storage.keep_models`) must be 0"),
        ({"storage": {"keep_models": -1}}, "(`storage.keep_models`) must be 0"),
        ({"storage": {"keep": 3}}, "unknown key `storage.keep`"),
        ({"max_fruitless_reselections": 0}, "`max_fruitless_reselections` must be >= 1, got 0"),
        ({"keep_serving": "yes"}, "`keep_serving` must be bool, got 'yes'"),
    ],
)
def test_bad_values_are_refused_naming_the_key(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config({"state_dir": "state", **table}, {})
    assert message in str(info.value)


def test_defaults_and_overrides() -> None:
    config = build_config({"state_dir": "state"}, {})
    assert (config.keep_models, config.keep_serving, config.max_fruitless_reselections) == (
        3,
        False,
        3,
    )
    config = build_config(
        {"state_dir": "state", "storage": {"keep_models": 0}}, {"storage.keep_models": 5}
    )
    assert config.keep_models == 5  # the flag wins over the file
