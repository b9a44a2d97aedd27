"""On-device training as an app drives it: signature runners, checkpoints that resume
bit-exactly, fused activations, trainable-name errors."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import InputError, Interpreter, ModelBuilder, OpCode, parse, serialize
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model


def mlp(*, fused: bool = True, seed: int = 0, dropout: bool = False):
    """x -> FC(8) + HardSwish [-> Dropout] -> FC(3); the activation fused into the FC or a
    separate op."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    w1 = b.constant("fc1.weight", rng.normal(size=(8, 4)), np.float32)
    b1 = b.constant("fc1.bias", rng.normal(size=8) * 0.1, np.float32)
    if fused:
        h = b.op(OpCode.FULLY_CONNECTED, [x, w1, b1], activation="hard_swish")
    else:
        h = b.op(OpCode.HARD_SWISH, [b.op(OpCode.FULLY_CONNECTED, [x, w1, b1])])
    if dropout:
        h = b.op(OpCode.DROPOUT, [h], ratio=0.3, seed=7)
    w2 = b.constant("fc2.weight", rng.normal(size=(3, 8)) * 0.5, np.float32)
    b2 = b.constant("fc2.bias", np.zeros(3), np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, w2, b2]), "logits")
    return b.build()


def data(n=96, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    return x, y


def train_file(**kwargs) -> bytes:
    """A training model written to bytes and read back (its weights are read-only views)."""
    model = make_training_model(
        mlp(**kwargs),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("adam", lr=0.01),
    )
    return serialize(model)


def test_signature_runners_train_and_infer_share_weights():
    x, y = data()
    interpreter = Interpreter(model_content=train_file(), signature="train")
    train = interpreter.get_signature_runner("train")
    infer = interpreter.get_signature_runner("infer")
    assert set(train.get_input_details()) == {"x", "labels", "lr"}
    before = infer(x=x)["logits"]
    reference = Interpreter(model_content=train_file()).run({"x": x})["logits"]
    np.testing.assert_array_equal(before, reference)
    losses = [float(train(x=x, labels=y, lr=0.05)["loss"]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    after = infer(x=x)["logits"]
    assert (after.argmax(1) == y).mean() > (before.argmax(1) == y).mean()
    # The same signature through Interpreter.run (several inputs resized at once).
    out = interpreter.run({"x": x[:5], "labels": y[:5], "lr": np.float32(0.0)})
    assert out["loss"].shape == () and out["logits"].shape == (5, 3)


def test_runner_errors_name_the_inputs():
    runner = Interpreter(model_content=train_file()).get_signature_runner("train")
    with pytest.raises(InputError, match=r"missing \['labels'\]"):
        runner(x=np.zeros((2, 4), np.float32), lr=0.1)
    with pytest.raises(InputError, match="'x'"):
        runner(x=np.zeros((2, 5), np.float32), labels=np.zeros(2, np.int64), lr=0.1)
    with pytest.raises(InputError, match="several signatures"):
        Interpreter(model_content=train_file()).get_signature_runner()


def _run(trainer: Trainer, x, y, steps: int, start: int) -> None:
    for k in range(start, start + steps):
        batch = np.arange(k * 16, k * 16 + 16) % len(y)
        trainer.step({"x": x[batch], "labels": y[batch]}, 0.01)


def test_checkpoint_resumes_bit_exactly(tmp_path):
    x, y = data()
    straight = Trainer(parse(train_file()))
    _run(straight, x, y, 12, 0)

    first = Trainer(parse(train_file()))
    _run(first, x, y, 6, 0)
    first.save_checkpoint(tmp_path / "ckpt.spore")
    resumed = Trainer(parse(train_file()))
    resumed.load_checkpoint(tmp_path / "ckpt.spore")
    assert resumed.steps == 6
    _run(resumed, x, y, 6, 6)

    names = {straight.model.tensors[i].name for i in straight.variables}
    assert {"fc1.weight/adam_m", "fc1.weight/adam_v", "fc1.weight/adam_step"} <= names
    for i, value in straight.variables.items():
        assert resumed.variables[i].tobytes() == value.tobytes(), straight.model.tensors[i].name
    # A Trainer built straight from the checkpoint file resumes the same way.
    again = Trainer(parse((tmp_path / "ckpt.spore").read_bytes()))
    _run(again, x, y, 6, 6)
    assert again.steps == 12
    for i, value in straight.variables.items():
        assert again.variables[i].tobytes() == value.tobytes()


def test_checkpoint_with_dropout_resumes_bit_exactly(tmp_path):
    """Dropout's random state travels with the checkpoint: N steps, save, M more steps
    equals restoring the checkpoint in a fresh Trainer and running the same M steps."""
    x, y = data()
    first = Trainer(parse(train_file(dropout=True)))
    _run(first, x, y, 5, 0)
    first.save_checkpoint(tmp_path / "ckpt.spore")
    _run(first, x, y, 5, 5)

    resumed = Trainer(parse(train_file(dropout=True)))
    resumed.load_checkpoint(tmp_path / "ckpt.spore")
    _run(resumed, x, y, 5, 5)
    for i, value in first.variables.items():
        assert resumed.variables[i].tobytes() == value.tobytes(), first.model.tensors[i].name
    # The masks' step counter is part of the saved state.
    assert any(t.name.endswith("/rng_step") for t in parse(train_file(dropout=True)).tensors)


def test_dropout_masks_continue_across_batch_sizes():
    """A new batch size re-plans the train graph; its Dropout continues the random stream
    instead of restarting it from the seed (lr 0 keeps the weights, so only masks differ)."""
    x, y = data()
    trainer = Trainer(parse(train_file(dropout=True)))
    trainer.step({"x": x[:16], "labels": y[:16]}, 0.0)
    second = trainer.step({"x": x[:8], "labels": y[:8]}, 0.0)
    fresh = Trainer(parse(train_file(dropout=True)))
    assert second != fresh.step({"x": x[:8], "labels": y[:8]}, 0.0)
    names = {trainer.model.tensors[i].name: v for i, v in trainer.variables.items()}
    (counter,) = [v for name, v in names.items() if name.endswith("/rng_step")]
    assert int(counter) == 2


def test_checkpoint_of_another_model_is_refused(tmp_path):
    other = make_training_model(
        mlp(),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
    )
    Trainer(other).save_checkpoint(tmp_path / "sgd.spore")
    with pytest.raises(InputError, match="adam_m' missing"):
        Trainer(parse(train_file())).load_checkpoint(tmp_path / "sgd.spore")


def test_fused_hard_swish_trains_like_the_separate_op():
    x, y = data()
    fused = Trainer(parse(train_file(fused=True)))
    separate = Trainer(parse(train_file(fused=False)))
    for _ in range(5):
        a = fused.step({"x": x, "labels": y}, 0.01)
        b = separate.step({"x": x, "labels": y}, 0.01)
        assert a == pytest.approx(b, rel=1e-6)
    for name, value in separate.weights().items():
        np.testing.assert_allclose(fused.weights()[name], value, rtol=1e-5, atol=1e-6)
    # The exported inference model keeps the fused (faster) form.
    ops = [n.op for n in fused.export().graphs[0].nodes]
    assert OpCode.HARD_SWISH not in ops


def test_unknown_trainable_name_lists_the_valid_ones():
    with pytest.raises(InputError) as info:
        make_training_model(
            mlp(),
            output="logits",
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig(),
            trainable={"14.weight"},
        )
    message = str(info.value)
    assert "['14.weight']" in message
    assert "['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight']" in message


def test_step_without_lr_uses_the_optimizer_configs_rate():
    x, y = data()
    defaulted = Trainer(parse(train_file()))
    explicit = Trainer(parse(train_file()))
    for _ in range(3):
        a = defaulted.step({"x": x, "labels": y})
        b = explicit.step({"x": x, "labels": y}, lr=0.01)
        assert a == b
    for name, w in defaulted.weights().items():
        np.testing.assert_array_equal(w, explicit.weights()[name])
    assert defaulted.default_lr == 0.01
