"""A job's settings, stored when the job starts and used again on every restart.

The settings that define what a job computes (rounds, cohort sizes, update bounds, the
strategy, secure aggregation, differential privacy) are saved in the state database as
the TOML tables write them. A restart with only `--state-dir` resumes the job exactly; a
restart that sets one of them differently is refused, naming each conflicting key, so a
restart can never quietly drop DP or secure aggregation or change the number of rounds.
Operational settings (address, TLS, auth, timeouts, logging) may change on a restart.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sporenet.federated.errors import ConfigError
from sporenet.federated.server import job_security
from sporenet.federated.server.config import _SECAGG_KEYS, ServerConfig, build_config, read_toml
from sporenet.federated.server.state import Store

META_KEY = "job_settings"
TOP_KEYS = (
    "rounds",
    "min_clients",
    "min_available",
    "fraction",
    "evaluate_every",
    "evaluate_fraction",
    "max_update_norm",
    "max_update_bytes",
    "seed",
)


def job_table(config: ServerConfig) -> dict[str, Any]:
    """The job-defining settings of `config`, as TOML values (unset ones left out)."""
    out: dict[str, Any] = {k: getattr(config, k) for k in TOP_KEYS}
    out["strategy"] = {"name": config.strategy.name, **config.strategy.options}
    out["fit_config"] = dict(config.fit_config)
    sa = config.secure_aggregation
    if sa is not None:
        table: dict[str, Any] = {"enabled": True}
        table.update({key: getattr(sa.protocol, attr) for key, attr in _SECAGG_KEYS.items()})
        table.update(max_weight=sa.max_weight, stage_timeout=sa.stage_timeout, retries=sa.retries)
        out["secure_aggregation"] = table
    dp = config.differential_privacy
    if dp is not None:
        out["differential_privacy"] = {"enabled": True, **dataclasses.asdict(dp)}
    job = config.job
    if job.is_async:  # (sync jobs store no `[job]` table, as before it existed)
        out["job"] = {
            "mode": job.mode.value,
            "concurrency": job.concurrency,
            "buffer_size": job.buffer_size,
            "max_staleness": job.max_staleness,
            "staleness": {"name": job.staleness, **job.staleness_options},
        }
    return _without_none(out)


def _without_none(table: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, Mapping) else v
        for k, v in table.items()
        if v is not None
    }


def stored(state_dir: Path, key: str = META_KEY) -> dict[str, Any] | None:
    """The settings saved by the job in `state_dir` under `key` (None: no job, or none
    saved).

    A database that cannot be read is left to the daemon's start-up checks to report.
    """
    db = Path(state_dir) / "state.db"
    if not db.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return json.loads(rows[0][0]) if rows else None


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, Mapping) and k != "fit_config":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def with_stored_security(values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with the `[auth]` and `[tls]` of the job in the state dir filled in where
    neither the file nor the flags give them (job_security.py)."""
    where = overrides.get("state_dir") or values.get("state_dir")
    if not isinstance(where, (str, Path)):
        return dict(values)  # build_config says what is wrong
    saved = job_security.kept(
        stored(Path(where), job_security.META_KEY), stored(Path(where), "config")
    )
    return job_security.merge_stored(values, overrides, saved)


def resume_config(path: Path | None, overrides: Mapping[str, Any]) -> ServerConfig:
    """The daemon's configuration: the config file and flags, on top of the settings the
    job in the state dir was started with (if any).

    Raises:
        ConfigError: a bad setting, or settings that conflict with the stored job's
            (each conflicting key named with both values).
    """
    values = with_stored_security(read_toml(path), overrides)
    given = build_config(values, overrides)
    saved = stored(Path(given.state_dir))
    if saved is None:
        return given
    merged: dict[str, Any] = {k: v for k, v in saved.items()}
    for key, value in values.items():
        if key == "strategy" and isinstance(value, str):
            value = {"name": value}
        other_strategy = (
            key == "strategy"
            and isinstance(value, dict)
            and value.get("name") != merged[key]["name"]
        )
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and not other_strategy:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    config = build_config(merged, overrides)
    check_unchanged(saved, config)
    return config


def check_resumed(store: Store, config: ServerConfig) -> None:
    """Check `config` against the settings of the job `store` holds, recording them when
    the row is missing (after `check_unrecorded`).

    Raises:
        ConfigError: a conflicting setting, or a missing row whose job had DP or secure
            aggregation that `config` leaves out.
    """
    saved = store.get_meta(META_KEY)
    if saved is not None:
        check_unchanged(saved, config)
        return
    check_unrecorded(store, config)
    with store.transaction() as tx:
        tx.set_meta(META_KEY, job_table(config))


def check_unrecorded(store: Store, config: ServerConfig) -> None:
    """The job's settings row is missing (a state dir from before settings were stored,
    or damaged): refuse `config` when what the job left behind (its privacy ledger, its
    secure rounds, the configuration it last ran with) shows settings `config` lacks or
    sets differently, rather than resume, say, without the noise its epsilon promises.

    Raises:
        ConfigError: naming each missing or conflicting setting.
    """
    problems: list[str] = []
    privacy = store.get_meta("privacy")
    last = store.get_meta("config")
    last = last if isinstance(last, dict) else {}
    dp = config.differential_privacy
    if isinstance(privacy, dict) and privacy.get("accountant"):
        rounds = privacy.get("rounds") or []
        if dp is None:
            problems.append(
                f"`differential_privacy` (its privacy ledger: mode {privacy.get('mode')!r}, "
                f"epsilon {privacy.get('epsilon')} after {len(rounds)} round(s))"
            )
        else:
            if privacy.get("mode") and privacy["mode"] != dp.mode:
                problems.append(
                    f"`differential_privacy.mode` = {dp.mode!r} (the job has {privacy['mode']!r})"
                )
            z = rounds[-1].get("noise_multiplier") if rounds else None
            if z is not None and z != dp.noise_multiplier:
                problems.append(
                    f"`differential_privacy.noise_multiplier` = {dp.noise_multiplier!r} "
                    f"(the job's last round used {z!r})"
                )
    elif last.get("differential_privacy") and dp is None:
        problems.append("`differential_privacy` (the job last ran with it)")
    if config.secure_aggregation is None and (
        store.has_secure_state() or last.get("secure_aggregation")
    ):
        problems.append("`secure_aggregation` (the job ran secure rounds)")
    for key in TOP_KEYS:
        if key in last and last[key] != getattr(config, key):
            problems.append(
                f"`{key}` = {getattr(config, key)!r} (the job last ran with {last[key]!r})"
            )
    strategy = (last.get("strategy") or {}).get("name")
    if strategy is not None and strategy != config.strategy.name:
        problems.append(
            f"`strategy.name` = {config.strategy.name!r} (the job last ran with {strategy!r})"
        )
    if problems:
        raise ConfigError(
            f"state dir {str(config.state_dir)!r} has no stored job settings (state.db lost "
            "its `job_settings` row: a state dir from before settings were stored, or "
            "damaged), and the job it holds ran with other settings: "
            + "; ".join(problems)
            + ". Give the job's settings again (--config) to record them, or restore "
            "state.db from a backup"
        )


def check_unchanged(saved: Mapping[str, Any], config: ServerConfig) -> None:
    """Refuse `config` if a job-defining setting differs from the job's `saved` ones.

    Raises:
        ConfigError: naming each conflicting key with both values.
    """
    before, after = _flat(saved), _flat(job_table(config))
    conflicts = [
        f"`{key}` = {after.get(key)!r} (the job has {before.get(key)!r})"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]
    if conflicts:
        raise ConfigError(
            f"state dir {str(config.state_dir)!r} holds a job started with other settings: "
            + "; ".join(conflicts)
            + ". Restart with only --state-dir to resume it, or use a new --state-dir "
            "for a new job"
        )
