"""DataParallel: real worker processes (local) and Ray actors give the model that
single-process training on the combined batch gives, and checkpoints resume it."""

from __future__ import annotations

import copy
import importlib.util
import os
import signal

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L


def _cnn():
    cloud.manual_seed(0)
    return cloud.Sequential(
        L.Conv2d(1, 4, 3, padding=1),
        L.ReLU(),
        L.MaxPool2d(2),
        L.Flatten(),
        L.Dense(4 * 4 * 4, 10),
    )


def _data(n=150):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, n)


def _fit(net, x, y, **kwargs):
    kwargs.setdefault("epochs", 2)
    return cloud.fit(
        net,
        x,
        y,
        batch_size=64,
        verbose=0,
        mode="graph",
        optimizer=kwargs.pop("optimizer"),
        **kwargs,
    )


def _assert_same_model(a, b, rtol=1e-5, atol=1e-6):
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_allclose(p.value, q.value, rtol=rtol, atol=atol, err_msg=name)


def test_two_local_workers_equal_one_process_on_the_combined_batch():
    # 150 samples in batches of 64: the last batch (22) splits 11/11, the others 32/32.
    x, y = _data()
    single, parallel = _cnn(), _cnn()
    h1 = _fit(single, x, y, optimizer=cloud.Adam(lr=1e-2))
    h2 = _fit(parallel, x, y, optimizer=cloud.Adam(lr=1e-2), parallel=cloud.DataParallel(workers=2))
    np.testing.assert_allclose(h1["loss"], h2["loss"], rtol=1e-5)
    _assert_same_model(single, parallel)


def test_one_worker_is_graph_mode_bit_for_bit():
    # One worker runs graph mode's train graph, split at its updates, in the driver: the
    # same kernels on the same batch, so no rounding may differ.
    x, y = _data()
    single, parallel = _cnn(), _cnn()
    h1 = _fit(single, x, y, optimizer=cloud.Adam(lr=1e-2))
    h2 = _fit(parallel, x, y, optimizer=cloud.Adam(lr=1e-2), parallel=cloud.DataParallel(workers=1))
    assert h1["loss"] == h2["loss"]
    _assert_same_model(single, parallel, rtol=0, atol=0)


def test_more_workers_than_rows_and_resume_from_a_checkpoint(tmp_path):
    # Three workers, a last batch of 2 rows: one worker has an empty shard.
    x, y = _data(130)
    reference = _cnn()
    _fit(reference, x, y, optimizer=cloud.SGD(lr=0.05, momentum=0.9))
    net = _cnn()
    opt = cloud.SGD(lr=0.05, momentum=0.9)
    dp = cloud.DataParallel(workers=3)
    _fit(net, x, y, optimizer=opt, epochs=1, parallel=dp)
    path = cloud.save_checkpoint(tmp_path / "ckpt.npz", net, optimizer=opt, epoch=1)
    resumed, opt2 = _cnn(), cloud.SGD(lr=0.05, momentum=0.9)
    ckpt = cloud.load_checkpoint(path, resumed, optimizer=opt2)
    _fit(resumed, x, y, optimizer=opt2, initial_epoch=ckpt.epoch, parallel=dp)
    _assert_same_model(reference, resumed)


def test_data_parallel_refuses_what_it_cannot_match():
    x, y = _data(20)
    with pytest.raises(cloud.ConfigError, match="workers"):
        cloud.DataParallel(workers=0)
    with pytest.raises(cloud.ConfigError, match="backend"):
        cloud.DataParallel(backend="mpi")
    with pytest.raises(cloud.ConfigError, match="mode='graph'"):
        cloud.fit(_cnn(), x, y, epochs=1, verbose=0, mode="eager", parallel=cloud.DataParallel())
    bn = cloud.Sequential(L.Conv2d(1, 2, 3), L.BatchNorm2d(2), L.Flatten(), L.Dense(72, 10))
    with pytest.raises(cloud.ConfigError, match="BATCH_NORM"):
        cloud.fit(bn, x, y, epochs=1, verbose=0, mode="graph", parallel=cloud.DataParallel())


class _KillWorker(cloud.Callback):
    """Kills one worker process before the given step, as the OOM killer would."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_batch_begin(self, batch, state):
        if state.step == self.at_step:
            proc = state.engine.backend._procs[0]  # rank 1: the driver is rank 0
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()


def test_a_worker_that_dies_fails_fit_with_a_reason_instead_of_hanging():
    # The surviving worker would wait at the step's barrier for the dead one's gradients.
    x, y = _data()
    with pytest.raises(cloud.CloudError, match="worker 1 exited"):
        _fit(
            _cnn(),
            x,
            y,
            optimizer=cloud.Adam(lr=1e-2),
            parallel=cloud.DataParallel(workers=2),
            callbacks=[_KillWorker(at_step=1)],
        )


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed (pip install ray); it is not part of the test extra",
)
def test_ray_actors_give_the_local_backends_model():
    x, y = _data()
    local, remote = _cnn(), copy.deepcopy(_cnn())
    _fit(local, x, y, optimizer=cloud.Adam(lr=1e-2), parallel=cloud.DataParallel(workers=2))
    _fit(
        remote,
        x,
        y,
        optimizer=cloud.Adam(lr=1e-2),
        parallel=cloud.DataParallel(workers=2, backend="ray"),
    )
    _assert_same_model(local, remote, rtol=0, atol=0)  # the same sums in the same order
