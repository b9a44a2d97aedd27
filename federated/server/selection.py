"""Persisting what the machine changed in an open plain phase: dropouts, replacements.

The machine (machine.py) moves the participants in memory; these write the same change
to the store in one transaction, count it and log it, for plain fit and evaluate alike.
"""

from __future__ import annotations

import logging

from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.machine import Step, Verdict
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.phases import Participant


def drop_silent(ctx: JobContext, now: float) -> None:
    """Selected clients silent past heartbeat_timeout are dropped."""
    dropped = ctx.machine.silent(now)
    if not dropped:
        return
    with ctx.store.transaction() as tx:
        for cid in dropped:
            ctx.set_status(cid, Participant.DROPPED, tx=tx)
    ctx.metrics.inc("sporenet_clients_dropped_total", len(dropped))
    log_event(ctx.log, "clients_dropped", logging.WARNING, round=ctx.job.round, clients=dropped)


def persist_step(ctx: JobContext, step: Step) -> None:
    """Store a RESELECT step's replacements and moved deadline (other verdicts store
    nothing here: closing and failing are the round manager's)."""
    if step.verdict != Verdict.RESELECT:
        return
    job = ctx.job
    with ctx.store.transaction() as tx:
        for cid in step.added:
            ctx.set_status(cid, Participant.SELECTED, tx=tx)
        tx.set_job(job)
    log_event(
        ctx.log,
        "phase_reselected",
        logging.WARNING,
        round=job.round,
        accepted=step.accepted,
        added=len(step.added),
        attempt=job.attempt,
    )
    ctx.notify()
