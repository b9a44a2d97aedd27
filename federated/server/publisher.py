"""What a closed phase becomes, chosen by the tier: the cloud publishes a model version.

The round manager is the same on every tier; a `Publisher` decides what its phases are
for. `CloudPublisher` (here) turns a closed fit phase into the next model version and
an evaluate phase into the round's metrics, and moves the job on; an edge's publisher
(edge/rounds.py) keeps the partial aggregate for the cloud instead. The manager calls
`fail` under its lock and `publish_fit` / `finish_evaluate` outside it, after the phase
closed, so heartbeats and polls keep flowing while a round is aggregated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from sporenet.federated.errors import AggregationError, StaleTaskError
from sporenet.federated.privacy import PrivacyError
from sporenet.federated.secagg import SecAggError
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.open_phase import FitResult, OpenPhase
from sporenet.federated.server.phases import JobStatus, Participant, Phase
from sporenet.federated.server.publication import Publication, PublishOnce
from sporenet.federated.server.state import ModelRecord


def weighted_metrics(rows: Sequence[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """Sample-weighted mean of each metric over the clients that reported it."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for n, metrics in rows:
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + n * v
            weights[k] = weights.get(k, 0.0) + n
    return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}


def accepted_rows(ctx: JobContext, phase: Phase) -> list[tuple[int, dict[str, float]]]:
    """(samples, metrics) of the open round's accepted participants in `phase`."""
    ctx.save_rows()  # the journalled ones too
    rows = ctx.store.participants(ctx.job.round, phase, Participant.ACCEPTED)
    return [(n, m) for (_, n, m) in rows.values()]


class Publisher(Protocol):
    """What the tier does with the job's phases (see the module docstring)."""

    @property
    def pending(self) -> bool:
        """True while a closed phase's result is held for a retry (it takes no answers)."""

    def may_start(self) -> bool:
        """Whether a waiting phase may start now (an edge: only with a cloud task)."""

    def task_config(self) -> dict[str, Any]:
        """The config every task of the phase about to start carries."""

    def fail(self, reason: str) -> None:
        """The open phase cannot complete (under the manager's lock)."""

    def publish_fit(self, phase: OpenPhase) -> None:
        """The closed fit phase's result is published (outside the lock)."""

    def finish_evaluate(self) -> None:
        """The closed evaluate phase's reports are summarised (outside the lock)."""


def fail_job(ctx: JobContext, reason: str) -> None:
    """End the job as failed (call it under the lock)."""
    ctx.uploads.clear()
    ctx.commits.failed(StaleTaskError(f"the job failed before the update was saved: {reason}"))
    ctx.machine.fail(reason)
    ctx.save_job()
    log_event(ctx.log, "job_failed", logging.ERROR, reason=reason)
    ctx.notify()


def finish_for_budget(ctx: JobContext, why: str) -> None:
    """End the job cleanly (finished, not failed): the next round would overspend."""
    ctx.machine.finish(why)
    ctx.save_job()
    log_event(ctx.log, "job_finished", reason=why, model_version=ctx.job.model_version)
    ctx.notify()


@contextlib.contextmanager
def job_transaction(ctx: JobContext) -> Iterator[Any]:
    """A store transaction that also changes the job: if it does not commit, the job in
    memory is put back as it was, so a retry starts from what the store holds."""
    job = ctx.job
    before = dataclasses.replace(job)
    try:
        with ctx.store.transaction() as tx:
            yield tx
    except BaseException:
        for f in dataclasses.fields(before):
            setattr(job, f.name, getattr(before, f.name))
        raise


class CloudPublisher:
    """Each closed fit phase publishes the next model version; the job ends at its last
    round (or when the privacy budget would be overspent)."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._once = PublishOnce()  # a closed phase's model until it is durable

    @property
    def pending(self) -> bool:
        return self._once.pending

    def may_start(self) -> bool:
        return True

    def task_config(self) -> dict[str, Any]:
        ctx = self._ctx
        job = ctx.job
        config = {"round": job.round, "rounds": ctx.config.rounds, **ctx.config.fit_config}
        if job.phase == Phase.FIT:
            config.update(ctx.strategy.fit_config(job.round))
        return config

    def fail(self, reason: str) -> None:
        self._once.release()
        fail_job(self._ctx, reason)

    # -- fit ---------------------------------------------------------------------------

    def publish_fit(self, phase: OpenPhase) -> None:
        """Aggregate the closed fit phase and publish the next model version: prepared
        once (the noise drawn, the optimizer run, the privacy charge worked out), then
        written and recorded, retried from the failed step until it is durable."""
        ctx = self._ctx
        job, t0 = ctx.job, ctx.clock()
        publication = self._once.held(ctx.machine.task_id())
        if publication is None:
            publication = self._prepare(phase)
            if publication is None:
                return
        files = ctx.files()
        try:
            record = self._record(publication, phase)
        except Exception:
            publication.failures += 1
            raise
        self._once.release()
        ctx.commits.made_durable()  # the published version holds the phase's updates
        files.remove()
        # Only now that the store names `version`: a restart before this resumed from the last.
        removed = ctx.models.prune(record.version, ctx.config.models_kept)
        took = ctx.clock() - t0
        ctx.metrics.inc("sporenet_rounds_completed_total")
        ctx.metrics.set("sporenet_aggregation_seconds", took)
        ctx.metrics.set("sporenet_round_duration_seconds", ctx.clock() - job.phase_started)
        ctx.metrics.set("sporenet_current_round", job.round)
        log_event(
            ctx.log,
            "round_published",
            round=record.round,
            version=record.version,
            clients=publication.clients,
            aggregation_s=round(took, 4),
            metrics=publication.summary,
            models_removed=removed,
            failed_attempts=publication.failures,
            **publication.secure_info,
            **publication.privacy_info,
        )
        if publication.all_rounds_done:  # (a budget stop logged its own job_finished)
            self._log_if_finished()

    def _prepare(self, phase: OpenPhase) -> Publication | None:
        """The closed phase's model, computed once (None: the job failed instead)."""
        ctx = self._ctx
        job = ctx.job
        try:
            result = phase.close()
            if not isinstance(result, FitResult):  # cannot happen: fit phases return one
                raise AggregationError("the fit phase closed without a result")
            new_weights, new_state = ctx.strategy.apply(
                ctx.model.weights, result.delta, ctx.model.moments
            )
            charged = ctx.privacy.charged(
                job.round,
                sample_rate=job.dp_sample_rate,
                cohort=job.dp_cohort,
                clipping_norm=result.clipping_norm,
            )
        except (AggregationError, SecAggError, PrivacyError) as e:
            with ctx.changed:
                self.fail(f"round {job.round}: {e}")
            return None
        secure_info = result.info
        del result  # large models: hold at most the sums, the new weights and their bytes
        data = ctx.model.with_weights(new_weights)
        del new_weights  # they are in `data` now: hold them once
        privacy_info = {}
        if charged is not None and charged.accountant is not None:
            privacy_info = {"epsilon": charged.epsilon(), "delta": charged.accountant.delta}
        accepted = accepted_rows(ctx, Phase.FIT)
        summary = weighted_metrics(accepted)
        summary["num_samples"] = float(sum(n for n, _ in accepted))
        return self._once.hold(
            Publication(
                ctx.machine.task_id(),
                data,
                new_state,
                secure_info,
                charged=charged,
                privacy_info=privacy_info,
                clients=len(accepted),
                summary=summary,
                sample_rate=job.dp_sample_rate,
            )
        )

    def _record(self, publication: Publication, phase: OpenPhase) -> ModelRecord:
        """Write the model (once) and record it, its round and what it spent in one
        transaction; the ledger takes the charge only once that has committed."""
        ctx = self._ctx
        job = ctx.job
        version = job.model_version + 1
        if publication.record is None:
            ctx.models.write_moments(version, publication.moments)
            publication.record = ctx.models.write(version, job.round, publication.data)
        record = publication.record
        with ctx.changed:
            with job_transaction(ctx) as tx:
                tx.add_model(record)
                tx.finish_round(job.round, Phase.FIT, publication.clients, publication.summary)
                tx.delete_secure_state(job.round)
                if publication.charged is not None:  # what this round spent, with its round
                    tx.set_meta("privacy", publication.charged.state())
                job.model_version = version
                ctx.machine.advance(ctx.clock())
                following = phase.follow(tx)
                tx.set_job(job)
            if publication.charged is not None:
                ctx.privacy.commit(publication.charged)
                # Logged before any client can see the round's end (under the lock).
                self._log_privacy_spent(
                    record.round, publication.sample_rate, publication.privacy_info
                )
            ctx.end_phase()
            if following is not None:
                ctx.phase = following
                following.enter()
            publication.all_rounds_done = job.status == JobStatus.FINISHED
            # Stop now if even the smallest sampling rate a round can have is unaffordable.
            # (After an evaluate phase, the next fit phase's start checks instead.)
            if job.status == JobStatus.RUNNING and job.phase == Phase.FIT:
                privacy = ctx.privacy
                why = privacy.budget_left(privacy.charged_rate(ctx.machine.smallest_rate()))
                if why:
                    finish_for_budget(ctx, why)
            ctx.model.publish(publication.data, publication.moments, record)
        return record

    def _log_privacy_spent(self, round_: int, sample_rate: float, info: dict[str, Any]) -> None:
        ctx = self._ctx
        acc = ctx.privacy.accountant
        ctx.metrics.set("sporenet_privacy_epsilon", info["epsilon"])
        log_event(
            ctx.log,
            "privacy_spent",
            round=round_,
            epsilon=info["epsilon"],
            delta=info["delta"],
            sample_rate=sample_rate,
            budget=acc.epsilon_budget if acc is not None else None,
        )

    # -- evaluate ----------------------------------------------------------------------

    def finish_evaluate(self) -> None:
        ctx = self._ctx
        job = ctx.job
        round_ = job.round  # advance moves the job to the next round
        accepted = accepted_rows(ctx, Phase.EVALUATE)
        summary = weighted_metrics(accepted)
        with ctx.changed:
            with job_transaction(ctx) as tx:
                tx.finish_round(round_, Phase.EVALUATE, len(accepted), summary)
                ctx.machine.advance(ctx.clock())
                tx.set_job(job)
            ctx.end_phase()
        log_event(
            ctx.log, "evaluation_finished", round=round_, clients=len(accepted), metrics=summary
        )
        self._log_if_finished()

    def _log_if_finished(self) -> None:
        """Log `job_finished` once the job is done (after the last phase's own event)."""
        ctx = self._ctx
        job = ctx.job
        if job.status == JobStatus.FINISHED:
            log_event(
                ctx.log, "job_finished", rounds=ctx.config.rounds, model_version=job.model_version
            )
