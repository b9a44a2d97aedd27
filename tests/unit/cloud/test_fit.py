"""fit in both modes: same numbers, learning, checkpoints and resume, callbacks."""

from __future__ import annotations

import io

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud.checkpoint import read_checkpoint
from sporenet.cloud.errors import CheckpointError

pytest.importorskip(
    "sklearn", reason="the digits data ships with scikit-learn (the optional `datasets` extra)"
)
DATA = cloud.load_digits()
X, Y = DATA.x_train[:256], DATA.y_train[:256]


def mlp(seed: int = 0) -> cloud.Sequential:
    cloud.manual_seed(seed)
    return cloud.models.digits_mlp(hidden=32)


def test_eager_and_graph_modes_give_the_same_numbers():
    results = {}
    for mode in ("eager", "graph"):
        model = mlp()
        history = cloud.fit(
            model,
            X,
            Y,
            epochs=2,
            batch_size=48,
            optimizer=cloud.Adam(lr=1e-2),
            seed=3,
            verbose=0,
            mode=mode,
        )
        results[mode] = (history["loss"], model.state_dict())
    # Same kernels and the same update ops; only BLAS summation order may differ.
    np.testing.assert_allclose(results["eager"][0], results["graph"][0], rtol=1e-5)
    for name, value in results["eager"][1].items():
        np.testing.assert_allclose(
            value, results["graph"][1][name], rtol=1e-4, atol=1e-6, err_msg=name
        )


def test_eager_gradients_match_finite_differences():
    # The eager tape + append_gradients path on a tiny model, checked numerically.
    cloud.manual_seed(5)
    model = cloud.Sequential(L.Dense(4, 3), L.Tanh(), L.Dense(3, 2))
    engine = cloud.engines.EagerEngine(
        model, loss="softmax_cross_entropy", optimizer=cloud.SGD(lr=0.1), label_smoothing=0.0
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=5)
    _, grads = engine.gradients(x, y)
    w = model[0].weight.value
    eps = 1e-2
    for idx in [(0, 0), (2, 3), (1, 2)]:
        old = w[idx]
        w[idx] = old + eps
        up = cloud.losses.softmax_cross_entropy(model(x), y)
        w[idx] = old - eps
        down = cloud.losses.softmax_cross_entropy(model(x), y)
        w[idx] = old
        # float32 forward passes: central differences are good to ~1e-3 here.
        assert grads["0.weight"][idx] == pytest.approx((up - down) / (2 * eps), rel=2e-2, abs=1e-3)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_fit_learns_digits(mode):
    model = mlp()
    history = cloud.fit(
        model,
        DATA.x_train,
        DATA.y_train,
        epochs=4,
        batch_size=32,
        optimizer=cloud.Adam(lr=3e-3),
        validation_data=(DATA.x_test, DATA.y_test),
        verbose=0,
        mode=mode,
    )
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["val_accuracy"][-1] > 0.85
    result = cloud.evaluate(model, DATA.x_test, DATA.y_test, mode=mode)
    assert result["accuracy"] == pytest.approx(history["val_accuracy"][-1])
    np.testing.assert_allclose(
        cloud.predict(model, DATA.x_test[:20], mode="eager"),
        cloud.predict(model, DATA.x_test[:20], mode="graph"),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_resume_from_checkpoint_gives_the_same_next_epoch(tmp_path, mode):
    def run(epochs, model, optimizer, **kw):
        return cloud.fit(
            model,
            X,
            Y,
            epochs=epochs,
            batch_size=64,
            optimizer=optimizer,
            seed=1,
            verbose=0,
            mode=mode,
            **kw,
        )

    straight, opt = mlp(), cloud.Adam(lr=1e-2)
    full = run(3, straight, opt)

    first, opt1 = mlp(), cloud.Adam(lr=1e-2)
    path = tmp_path / "ckpt-{epoch}.npz"
    run(2, first, opt1, callbacks=[cloud.ModelCheckpoint(path, save_best_only=False)])
    resumed, opt2 = mlp(seed=99), cloud.Adam(lr=1e-2)  # different initial weights
    ckpt = cloud.load_checkpoint(tmp_path / "ckpt-2.npz", resumed, optimizer=opt2)
    assert ckpt.epoch == 2 and opt2.state.step == opt1.state.step
    rest = run(3, resumed, opt2, initial_epoch=ckpt.epoch)
    assert rest["loss"][0] == pytest.approx(full["loss"][2], rel=1e-6)
    for name, value in straight.state_dict().items():
        np.testing.assert_allclose(resumed.state_dict()[name], value, rtol=1e-6, atol=1e-7)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        read_checkpoint(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        read_checkpoint(tmp_path / "junk.npz")
    cloud.save_checkpoint(tmp_path / "small.npz", cloud.Sequential(L.Dense(2, 2)))
    with pytest.raises(CheckpointError, match="missing"):
        cloud.load_checkpoint(tmp_path / "small.npz", mlp())
    cloud.save_checkpoint(tmp_path / "sgd.npz", mlp(), optimizer=cloud.SGD())
    with pytest.raises(CheckpointError, match="'sgd'"):
        cloud.load_checkpoint(tmp_path / "sgd.npz", mlp(), optimizer=cloud.Adam())


def test_early_stopping_stops_and_restores_best_weights():
    model = mlp()
    # A learning rate this high makes the validation loss climb after the first epochs.
    stopper = cloud.EarlyStopping(monitor="val_loss", patience=1)
    history = cloud.fit(
        model,
        X,
        Y,
        epochs=30,
        batch_size=16,
        optimizer=cloud.SGD(lr=2.0),
        validation_data=(DATA.x_test[:100], DATA.y_test[:100]),
        callbacks=[stopper],
        verbose=0,
    )
    assert len(history["loss"]) < 30
    assert stopper.stopped_epoch == len(history["loss"]) - 1
    best = min(history["val_loss"])
    assert history["val_loss"][stopper.best_epoch] == best
    restored = cloud.evaluate(model, DATA.x_test[:100], DATA.y_test[:100])
    assert restored["loss"] == pytest.approx(best, rel=1e-5)


def test_learning_rate_schedule_is_applied_each_epoch():
    schedule = cloud.schedules.StepLR(0.02, step_size=2, gamma=0.5)
    history = cloud.fit(
        mlp(),
        X,
        Y,
        epochs=5,
        batch_size=64,
        optimizer=cloud.SGD(lr=0.02),
        callbacks=[cloud.LearningRateScheduler(schedule)],
        verbose=0,
    )
    assert history["lr"] == pytest.approx([0.02, 0.02, 0.01, 0.01, 0.005])
    # A zero-progress schedule really changes training: lr 1e-9 leaves the loss flat.
    frozen = cloud.fit(
        mlp(),
        X,
        Y,
        epochs=2,
        batch_size=64,
        optimizer=cloud.SGD(lr=0.02),
        callbacks=[cloud.LearningRateScheduler(lambda t: 1e-9)],
        verbose=0,
    )
    assert frozen["loss"][1] == pytest.approx(frozen["loss"][0], rel=1e-3)


def test_progress_output_lines():
    stream = io.StringIO()
    bar = cloud.ProgressBar(verbose=2, stream=stream)
    cloud.fit(mlp(), X, Y, epochs=2, batch_size=64, callbacks=[bar], verbose=0)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("epoch 1/2") and "loss" in lines[0]


def test_plot_writes_a_png_only_when_matplotlib_is_installed(tmp_path):
    path = tmp_path / "curves.png"
    history = cloud.fit(
        mlp(),
        X,
        Y,
        epochs=2,
        batch_size=64,
        verbose=0,
        plot=path,
        validation_data=(DATA.x_test[:50], DATA.y_test[:50]),
    )
    assert len(history["val_accuracy"]) == 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not path.exists()  # matplotlib is optional: no plot, no error
    else:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cnn_with_batchnorm_same_in_both_modes_and_running_stats_move():
    # Conv2d, DepthwiseConv2d, BatchNorm (training mode), pooling: one graph, two modes.
    x, y = DATA.x_train[:64], DATA.y_train[:64]
    results = {}
    for mode in ("eager", "graph"):
        cloud.manual_seed(2)
        model = cloud.Sequential(
            L.Rescale(1 / 16),
            L.Conv2d(1, 4, 3, padding=1, bias=False),
            L.BatchNorm2d(4),
            L.ReLU(),
            L.DepthwiseConv2d(4, 3, padding=1),
            L.MaxPool2d(2),
            L.Flatten(),
            L.Dense(64, 10),
        )
        history = cloud.fit(
            model,
            x,
            y,
            epochs=2,
            batch_size=32,
            optimizer=cloud.SGD(lr=0.05, momentum=0.9),
            verbose=0,
            mode=mode,
        )
        results[mode] = (history["loss"], model.state_dict())
    np.testing.assert_allclose(results["eager"][0], results["graph"][0], rtol=1e-5)
    for name, value in results["eager"][1].items():
        np.testing.assert_allclose(
            value, results["graph"][1][name], rtol=1e-4, atol=1e-5, err_msg=name
        )
    state = results["graph"][1]
    assert not np.allclose(state["2.running_mean"], 0.0)  # updated by the training steps
    assert not np.allclose(state["2.running_var"], 1.0)


@pytest.mark.parametrize(
    ("loss", "kwargs"),
    [
        ("softmax_cross_entropy", {"label_smoothing": 0.1}),
        ("mse", {}),
        ("bce_with_logits", {}),
    ],
)
def test_every_loss_trains_the_same_in_both_modes(loss, kwargs):
    x = X[:96]
    y = DATA.y_train[:96]
    if loss != "softmax_cross_entropy":
        y = np.eye(10, dtype=np.float32)[y]  # one-hot targets shaped like the output
    losses = {}
    for mode in ("eager", "graph"):
        history = cloud.fit(
            mlp(),
            x,
            y,
            epochs=3,
            batch_size=32,
            optimizer=cloud.AdamW(lr=1e-2),
            loss=loss,
            verbose=0,
            mode=mode,
            **kwargs,
        )
        losses[mode] = history["loss"]
    np.testing.assert_allclose(losses["eager"], losses["graph"], rtol=1e-5)
    assert losses["graph"][-1] < losses["graph"][0]


def test_graph_mode_trains_conv_weights_under_a_frozen_bias():
    # A frozen bias is a constant of the train graph; the conv weights next to it are not,
    # so the forward must read them as they are updated (not as they were at planning).
    results = {}
    for mode in ("eager", "graph"):
        cloud.manual_seed(0)
        model = cloud.models.digits_cnn(batch_norm=False, dropout=0.0)
        for name, p in model.named_state():
            if name.endswith("bias"):
                p.trainable = False
        cloud.fit(
            model,
            X,
            Y,
            epochs=1,
            batch_size=48,
            optimizer=cloud.Adam(lr=1e-2),
            seed=3,
            verbose=0,
            mode=mode,
        )
        results[mode] = model.state_dict()
    for name, value in results["eager"].items():
        np.testing.assert_allclose(
            value, results["graph"][name], rtol=1e-4, atol=1e-5, err_msg=name
        )
