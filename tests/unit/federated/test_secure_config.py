"""The daemon's `[secure_aggregation]` settings: off by default, checked at start, keys named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sporenet.federated.errors import ConfigError
from sporenet.federated.secagg import SecAggConfig
from sporenet.federated.server.cli import main
from sporenet.federated.server.config import build_config


def build(table: dict[str, Any], **top: Any) -> Any:
    values: dict[str, Any] = {"state_dir": "s", "min_clients": 5, **top}
    if table is not None:
        values["secure_aggregation"] = table
    return build_config(values, {})


def test_off_by_default_and_enabled_by_table_or_flag() -> None:
    assert build_config({"state_dir": "s"}, {}).secure_aggregation is None
    assert build({"enabled": False, "threshold": 3}).secure_aggregation is None
    on = build(
        {
            "enabled": True,
            "neighbours": 4,
            "threshold": 3,
            "clipping_range": 0.5,
            "quantization_bits": 16,
            "modulus_bits": 32,
            "max_weight": 50,
            "stage_timeout": 7,
        }
    )
    assert on.secure_aggregation is not None
    assert on.secure_aggregation.protocol == SecAggConfig(
        num_neighbours=4, threshold=3, clipping_range=0.5, quantization_bits=16, modulus_bits=32
    )
    assert on.secure_aggregation.max_weight == 50 and on.secure_aggregation.stage_timeout == 7
    flag = build_config({"state_dir": "s", "min_clients": 3}, {"secure": True})
    assert flag.secure_aggregation is not None
    # neighbours grow as log n, per round; a plain mean unless max_weight is set
    assert flag.secure_aggregation.protocol == SecAggConfig()
    assert flag.secure_aggregation.max_weight is None


@pytest.mark.parametrize(
    ("table", "top", "message"),
    [
        ({"enabled": True, "threshold": 1}, {}, r"`secure_aggregation.threshold` must be"),
        ({"enabled": True, "neighbours": 3}, {}, r"`secure_aggregation.neighbours` must be even"),
        ({"enabled": True, "clipping_range": -1.0}, {}, r"`secure_aggregation.clipping_range`"),
        ({"enabled": True, "modulus_bits": 128}, {}, r"`secure_aggregation.modulus_bits`"),
        (
            {"enabled": True, "quantization_bits": 40, "modulus_bits": 32},
            {},
            r"`secure_aggregation.quantization_bits`",
        ),
        ({"enabled": True, "neighbours": "4"}, {}, r"`secure_aggregation.neighbours` must be int"),
        ({"enabled": True, "thresold": 3}, {}, r"unknown key `secure_aggregation.thresold`"),
        ({"enabled": True, "max_weight": 0}, {}, r"`secure_aggregation.max_weight`"),
        (
            {"enabled": True, "stage_timeout": 0},
            {},
            r"`secure_aggregation.stage_timeout` must be > 0",
        ),
        # 5 clients have at most 4 neighbours: a threshold of 5 could never be met.
        ({"enabled": True, "threshold": 5}, {}, r"min_clients=5.*`secure_aggregation.threshold`"),
        ({"enabled": True}, {"min_clients": 1}, r"`min_clients` must be >= 2"),
        ({"enabled": True}, {"strategy": "median"}, r"`strategy` 'median' needs every"),
        ("on", {}, r"`secure_aggregation` must be a table"),
    ],
)
def test_bad_values_name_the_key(table: Any, top: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(table, **top)


def test_the_daemon_refuses_a_bad_table_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "server.toml"
    config.write_text("[secure_aggregation]\nenabled = true\nneighbours = 5\n")
    assert main(["--config", str(config), "--state-dir", str(tmp_path / "s")]) == 2
    assert "`secure_aggregation.neighbours` must be even" in capsys.readouterr().err
