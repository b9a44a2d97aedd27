"""The daemon's `[differential_privacy]` settings: off by default, checked at start, keys named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sporenet.federated.errors import ConfigError
from sporenet.federated.privacy.config import DPConfig
from sporenet.federated.server.cli import main
from sporenet.federated.server.config import build_config


def build(table: Any, **top: Any) -> Any:
    return build_config(
        {"state_dir": "s", "min_clients": 3, "differential_privacy": table, **top}, {}
    )


def test_off_by_default_and_read_from_the_table() -> None:
    assert build_config({"state_dir": "s"}, {}).differential_privacy is None
    assert build({"enabled": False, "noise_multiplier": 1.0}).differential_privacy is None
    on = build(
        {
            "enabled": True,
            "noise_multiplier": 1,
            "clipping_norm": 0.5,
            "delta": 1e-6,
            "epsilon_budget": 4,
        }
    )
    assert on.differential_privacy == DPConfig(
        noise_multiplier=1.0, clipping_norm=0.5, delta=1e-6, epsilon_budget=4.0
    )
    adaptive = build(
        {
            "enabled": True,
            "noise_multiplier": 1.0,
            "adaptive_clipping": True,
            "count_noise_multiplier": 0.6,
            "target_quantile": 0.7,
        }
    )
    state = adaptive.differential_privacy.adaptive()
    assert state is not None and state.target_quantile == 0.7 and state.clipping_norm == 1.0
    assert on.differential_privacy.adaptive() is None


@pytest.mark.parametrize(
    ("table", "top", "message"),
    [
        ({"enabled": True, "mode": "laplace"}, {}, r"`differential_privacy.mode` must be one of"),
        ({"enabled": True, "noise_multiplier": 0}, {}, r"`differential_privacy.noise_multiplier`"),
        (
            {"enabled": True, "noise_multiplier": "1"},
            {},
            r"`differential_privacy.noise_multiplier` must be int or float",
        ),
        ({"enabled": True, "clipping_norm": -1.0}, {}, r"`differential_privacy.clipping_norm`"),
        (
            {"enabled": True, "clipping_norm": float("inf")},
            {},
            r"`differential_privacy.clipping_norm` must be a finite",
        ),
        ({"enabled": True, "delta": 1}, {}, r"`differential_privacy.delta` must be in \(0, 1\)"),
        ({"enabled": True, "epsilon_budget": 0}, {}, r"`differential_privacy.epsilon_budget`"),
        (
            {"enabled": True, "adaptive_clipping": True},
            {},
            r"`differential_privacy.count_noise_multiplier` must be a number > noise_multiplier/2",
        ),
        (
            {"enabled": True, "adaptive_clipping": True, "count_noise_multiplier": 0.4},
            {},
            r"`differential_privacy.count_noise_multiplier`",
        ),
        (
            {"enabled": True, "count_noise_multiplier": 2.0},
            {},
            r"`differential_privacy.count_noise_multiplier` only applies with adaptive",
        ),
        (
            {
                "enabled": True,
                "adaptive_clipping": True,
                "count_noise_multiplier": 1.0,
                "target_quantile": 1.0,
            },
            {},
            r"`differential_privacy.target_quantile`",
        ),
        ({"enabled": True, "noise": 1.0}, {}, r"unknown key `differential_privacy.noise`"),
        ({"enabled": "yes"}, {}, r"`differential_privacy.enabled` must be bool"),
        ({"enabled": True}, {"strategy": "median"}, r"`strategy` 'median' aggregates by order"),
        (
            {"enabled": True},
            {"secure_aggregation": {"enabled": True}},
            r"mode` \"central\" needs every individual update",
        ),
        (
            {"enabled": True, "mode": "distributed"},
            {},
            r"mode` \"distributed\" needs secure aggregation",
        ),
        (
            {"enabled": True, "mode": "distributed"},
            {"secure_aggregation": {"enabled": True, "max_weight": 10}},
            r"`secure_aggregation.max_weight` is not supported",
        ),
        (
            {
                "enabled": True,
                "mode": "distributed",
                "adaptive_clipping": True,
                "count_noise_multiplier": 1.0,
            },
            {"secure_aggregation": {"enabled": True}},
            r"`differential_privacy.adaptive_clipping` is only supported with mode",
        ),
        (
            {"enabled": True, "mode": "local"},
            {"secure_aggregation": {"enabled": True}},
            r"mode` \"local\" with secure aggregation",
        ),
        ("on", {}, r"`differential_privacy` must be a table"),
    ],
)
def test_bad_values_name_the_key(table: Any, top: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build(table, **top)


def test_distributed_mode_goes_with_secure_aggregation() -> None:
    cfg = build({"enabled": True, "mode": "distributed"}, secure_aggregation={"enabled": True})
    assert cfg.differential_privacy.mode == "distributed" and cfg.secure_aggregation is not None


def test_local_mode_works_with_any_strategy() -> None:
    cfg = build({"enabled": True, "mode": "local"}, strategy="median")
    assert cfg.differential_privacy.mode == "local" and cfg.strategy.name == "median"


def test_the_daemon_refuses_a_bad_table_at_start_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "s.toml"
    cfg.write_text("[differential_privacy]\nenabled = true\ndelta = 2.0\n")
    code = main(["--config", str(cfg), "--state-dir", str(tmp_path / "state")])
    assert code == 2
    assert "`differential_privacy.delta` must be in (0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
