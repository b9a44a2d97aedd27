"""`sporenet-server status`: the job as the state dir holds it, running daemon or not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sporenet.federated.errors import ConfigError
from sporenet.federated.secagg import SecAggError
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.restore import phase_rows
from sporenet.federated.server.secure_buffer import saved_stage
from sporenet.federated.server.state import JobState, Store


def config_summary(config: ServerConfig) -> dict[str, Any]:
    """The configuration as JSON, nested as the TOML tables, without secrets (the auth
    tokens, and their digests, are replaced by their names)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    out = {k: plain(v) for k, v in dataclasses.asdict(config).items()}
    out["auth"]["tokens"] = sorted(config.auth.tokens)
    out["auth"]["token_sha256"] = sorted(config.auth.token_sha256)
    return out


def _secure_stage(store: Store, job: JobState | None) -> str | None:
    """The stage of the job's open secure round, if any (from its saved state)."""
    data = store.secure_state(job.round) if job is not None else None
    if data is None:
        return None
    try:
        return saved_stage(data)
    except SecAggError as e:
        return f"unreadable: {e}"


def _upstream(state_dir: Path) -> dict[str, Any] | None:
    """An edge's link to the cloud (its `upstream.json`), None for a server's state dir."""
    try:
        value = json.loads((state_dir / "upstream.json").read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_status(state_dir: Path) -> dict[str, Any]:
    """The job's status straight from a state dir (works whether or not the daemon runs).

    Raises:
        ConfigError: `state_dir` holds no sporenet-server state.
    """
    db = Path(state_dir) / "state.db"
    upstream = _upstream(Path(state_dir))
    if not db.exists():
        if upstream is not None:  # an edge that has not had the cloud's first task yet
            return {"job": None, "upstream": upstream}
        raise ConfigError(f"{str(state_dir)!r} holds no sporenet-server state (no state.db)")
    store = Store(db)
    try:
        job = store.job()
        latest = store.model(job.model_version) if job else None
        participants = phase_rows(store, Path(state_dir), job.round, job.phase) if job else {}
        return {
            "job": dataclasses.asdict(job) if job else None,
            "model": dataclasses.asdict(latest) if latest else None,
            "clients_registered": len(store.clients()),
            "rounds": store.rounds(),
            "participants": {cid: status for cid, (status, _, _) in participants.items()},
            "config": store.get_meta("config"),
            "secure_stage": _secure_stage(store, job),
            "privacy": store.get_meta("privacy"),
            **({"upstream": upstream} if upstream is not None else {}),
            # An edge's state dir is a server's plus its identity (federated/edge/daemon.py).
            "tier": "edge" if (Path(state_dir) / "edge.json").exists() else "server",
        }
    finally:
        store.close()
