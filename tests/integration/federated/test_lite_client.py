"""LiteLearner: federated rounds trained by the lite Trainer against the real daemon."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import sporenet.lite
from sporenet.federated import ConfigError
from sporenet.federated.client.lite_client import LiteLearner
from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model
from tests.integration.federated.helpers import status_command

ROUNDS = 3


def mlp(seed: int = 0) -> sporenet.lite.Model:
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    w1 = b.constant("fc1.weight", rng.normal(size=(16, 4)) * 0.5, np.float32)
    b1 = b.constant("fc1.bias", np.zeros(16), np.float32)
    h = b.op(OpCode.FULLY_CONNECTED, [x, w1, b1], activation="relu")
    w2 = b.constant("head.weight", rng.normal(size=(3, 16)) * 0.1, np.float32)
    b2 = b.constant("head.bias", np.zeros(3), np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, w2, b2]), "logits")
    return b.build()


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    return x, y


def test_rounds_with_the_lite_trainer_and_fedprox(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "init.spore").write_bytes(sporenet.lite.serialize(mlp()))
    (tmp_path / "server.toml").write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = {ROUNDS}\nmin_clients = 2\n'
        "evaluate_every = 1\n"
        '[strategy]\nname = "fedprox"\nproximal_mu = 0.01\n'
        "[fit_config]\nepochs = 5\nlr = 0.2\nbatch_size = 16\n"
    )
    server = server_factory(["--config", str(tmp_path / "server.toml")]).start()
    x_test, y_test = data(300, seed=99)
    learners = [
        LiteLearner(
            tmp_path / "init.spore", *data(150, seed=k), x_eval=x_test, y_eval=y_test, seed=k
        )
        for k in range(2)
    ]
    seen: list[dict] = []
    train = learners[0].train

    def recording(weights, config):  # type: ignore[no-untyped-def]
        seen.append(dict(config))
        return train(weights, config)

    learners[0].train = recording  # type: ignore[method-assign]
    finals: dict[int, object] = {}

    def run(k: int) -> None:
        client = learners[k].client(
            server.address, name=f"lite-{k}", poll_wait=1.0, give_up_after=120
        )
        try:
            finals[k] = client.run()
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), server.logs()[-3000:]
    assert seen and all(c["proximal_mu"] == 0.01 and c["epochs"] == 5 for c in seen)
    evals = [r for r in status_command(server.state_dir)["rounds"] if r["phase"] == "evaluate"]
    accuracies = [r["metrics"]["accuracy"] for r in evals]
    initial = LiteLearner(mlp(), x_test, y_test).evaluate(mlp().weights(), {})[2]["accuracy"]
    assert len(accuracies) == ROUNDS, accuracies
    assert accuracies[-1] >= accuracies[0] and accuracies[-1] > initial + 0.15, (
        initial,
        accuracies,
    )
    # The final model, run by the plain interpreter, predicts as well as the rounds said.
    final = finals[0]
    assert isinstance(final, dict)
    model = sporenet.lite.replace_weights(mlp(), final)
    logits = sporenet.lite.Interpreter(model=model).run({"x": x_test})["logits"]
    assert np.mean(logits.argmax(1) == y_test) == pytest.approx(accuracies[-1], abs=1e-9)


def test_proximal_term_is_fedprox_sgd() -> None:
    """Two full-batch SGD steps with mu equal plain steps minus lr·mu·(w1 - w_global)."""
    x, y = data(64, seed=3)
    lr, mu = 0.1, 0.5
    learner = LiteLearner(mlp(), x, y, batch_size=64)
    w0 = mlp().weights()
    prox, _, _ = learner.train(w0, {"epochs": 2, "lr": lr, "proximal_mu": mu})

    plain = Trainer(
        make_training_model(
            mlp(),
            output="logits",
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig("sgd", lr=lr),
        )
    )
    plain.step({"x": x, "labels": y}, lr)
    w1 = plain.weights()
    plain.step({"x": x, "labels": y}, lr)
    for name, w2 in plain.weights().items():
        expected = w2 - lr * mu * (w1[name] - w0[name])
        np.testing.assert_allclose(prox[name], expected, rtol=1e-5, atol=1e-6)


def test_bad_round_config_names_the_key() -> None:
    x, y = data(8, seed=0)
    learner = LiteLearner(mlp(), x, y)
    with pytest.raises(ConfigError, match="`epochs` must be an integer > 0"):
        learner.train(mlp().weights(), {"epochs": 0})
    with pytest.raises(ConfigError, match="`proximal_mu`"):
        learner.train(mlp().weights(), {"proximal_mu": -1.0})
    with pytest.raises(ConfigError, match="`lr_decay` must be in"):
        learner.train(mlp().weights(), {"lr_decay": 1.5})
    with pytest.raises(ConfigError, match="`lr_decay` must be a number > 0"):
        learner.train(mlp().weights(), {"lr_decay": 0})
    with pytest.raises(ConfigError, match="`round` must be an integer >= 0"):
        learner.train(mlp().weights(), {"round": -2})
    with pytest.raises(ConfigError, match="`lr_decay` must be in"):
        LiteLearner(mlp(), x, y, lr_decay=2.0)


def test_lr_decay_trains_round_r_at_lr_times_decay_to_the_r_minus_1() -> None:
    """Round 4 with lr 0.2 and decay 0.5 is one full-batch SGD step at 0.025; the
    learner's own decay applies when the config has none, the config's wins."""
    x, y = data(64, seed=5)
    w0 = mlp().weights()
    plain = Trainer(
        make_training_model(
            mlp(), output="logits", loss="softmax_cross_entropy", optimizer=OptimizerConfig("sgd")
        )
    )
    plain.step({"x": x, "labels": y}, 0.2 * 0.5**3)
    expected = plain.weights()
    by_config = LiteLearner(mlp(), x, y, batch_size=64)
    by_default = LiteLearner(mlp(), x, y, batch_size=64, lr=0.2, lr_decay=0.5)
    overridden = LiteLearner(mlp(), x, y, batch_size=64, lr=0.2, lr_decay=0.9)
    for learner, config in (
        (by_config, {"lr": 0.2, "lr_decay": 0.5, "round": 4}),
        (by_default, {"round": 4}),
        (overridden, {"lr_decay": 0.5, "round": 4}),
    ):
        got, _, _ = learner.train(w0, config)
        for name, w in expected.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6)
    assert by_default.round_lr({}) == 0.2  # no round: the first, undecayed
    assert by_default.round_lr({"round": 0}) == 0.2
