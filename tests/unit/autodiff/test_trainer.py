"""make_training_model and Trainer end to end."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode, parse, serialize
from sporenet.lite.training import (
    CosineLR,
    OptimizerConfig,
    StepLR,
    Trainer,
    WarmUp,
    make_training_model,
)


def mlp(seed=0, hidden=16, classes=3, dropout=False):
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    w1 = b.constant("fc1.weight", rng.normal(size=(hidden, 4)) * 0.5, np.float32)
    b1 = b.constant("fc1.bias", np.zeros(hidden), np.float32)
    h = b.op(OpCode.FULLY_CONNECTED, [x, w1, b1], activation="relu")
    if dropout:
        h = b.op(OpCode.DROPOUT, [h], ratio=0.2, seed=1)
    w2 = b.constant("fc2.weight", rng.normal(size=(classes, hidden)) * 0.3, np.float32)
    b2 = b.constant("fc2.bias", np.zeros(classes), np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, w2, b2]), "logits")
    return b.build()


def separable(n=256, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
    return x, y


@pytest.mark.parametrize(
    "optimizer",
    [
        OptimizerConfig("sgd", lr=0.2, momentum=0.9, nesterov=True, weight_decay=1e-4),
        OptimizerConfig("adam", lr=0.02),
        OptimizerConfig("adamw", lr=0.02, weight_decay=0.01),
    ],
)
def test_mlp_loss_falls_and_accuracy_rises(optimizer):
    x, y = separable()
    model = make_training_model(
        mlp(dropout=True),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=optimizer,
        label_smoothing=0.05,
    )
    trainer = Trainer(model, num_threads=1)
    losses = []
    for _epoch in range(40):
        for k in range(0, len(x), 64):
            losses.append(trainer.step({"x": x[k : k + 64], "labels": y[k : k + 64]}, optimizer.lr))
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    accuracy = (trainer.evaluate({"x": x})["logits"].argmax(1) == y).mean()
    assert accuracy > 0.9


def test_head_only_training_leaves_the_backbone_bit_identical():
    x, y = separable()
    base = mlp()
    model = make_training_model(
        base,
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
        trainable={"fc2.weight", "fc2.bias"},
    )
    trainer = Trainer(model)
    for _ in range(10):
        trainer.step({"x": x, "labels": y}, 0.1)
    weights = trainer.weights()
    assert set(weights) == {"fc2.weight", "fc2.bias"}
    exported = trainer.export().weights()
    original = base.weights()
    for name in ("fc1.weight", "fc1.bias"):
        assert exported[name].tobytes() == original[name].tobytes()
    assert not np.array_equal(exported["fc2.weight"], original["fc2.weight"])
    np.testing.assert_array_equal(exported["fc2.weight"], weights["fc2.weight"])


def test_export_matches_evaluate_and_round_trips_through_a_file():
    x, y = separable(64)
    model = make_training_model(
        mlp(dropout=True),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("adam", lr=0.01),
    )
    # The training model itself serializes (two graphs, update nodes without outputs).
    model = parse(serialize(model))
    trainer = Trainer(model)
    for _ in range(5):
        trainer.step({"x": x, "labels": y}, 0.01)
    exported = trainer.export()
    assert list(exported.signatures) == ["infer"]
    assert not any(k.startswith("train.") for k in exported.metadata)
    assert not any("/adam_" in t.name for t in exported.tensors)
    out = Interpreter(model_content=serialize(exported)).run({"x": x})["logits"]
    np.testing.assert_allclose(out, trainer.evaluate({"x": x})["logits"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loss", ["mse", "bce_with_logits"])
def test_regression_and_binary_losses_train(loss):
    x, y = separable()
    target = np.eye(3, dtype=np.float32)[y]
    model = make_training_model(
        mlp(), output="logits", loss=loss, optimizer=OptimizerConfig("sgd", lr=0.5)
    )
    trainer = Trainer(model)
    first = trainer.step({"x": x, "labels": target}, 0.5)
    for _ in range(100):
        last = trainer.step({"x": x, "labels": target}, 0.5)
    assert last < 0.6 * first


def test_one_hot_labels_match_class_ids():
    x, y = separable(32)
    opt = OptimizerConfig("sgd", lr=0.1)
    by_id = Trainer(
        make_training_model(mlp(), output="logits", loss="softmax_cross_entropy", optimizer=opt)
    )
    one_hot = Trainer(
        make_training_model(
            mlp(), output="logits", loss="softmax_cross_entropy", optimizer=opt, one_hot_labels=True
        )
    )
    for _ in range(3):
        a = by_id.step({"x": x, "labels": y}, 0.1)
        b = one_hot.step({"x": x, "labels": np.eye(3, dtype=np.float32)[y]}, 0.1)
        assert a == pytest.approx(b, rel=1e-6)


def test_configuration_errors_are_reported_when_built():
    with pytest.raises(ValueError, match="optimizer kind"):
        OptimizerConfig("rmsprop")
    with pytest.raises(ValueError, match="nesterov"):
        OptimizerConfig("sgd", nesterov=True)
    with pytest.raises(ValueError, match="output 'nope'"):
        make_training_model(mlp(), output="nope", loss="mse", optimizer=OptimizerConfig())
    with pytest.raises(ValueError, match="loss must be"):
        make_training_model(mlp(), output="logits", loss="hinge", optimizer=OptimizerConfig())
    with pytest.raises(ValueError, match="unknown tensors"):
        make_training_model(
            mlp(),
            output="logits",
            loss="mse",
            optimizer=OptimizerConfig(),
            trainable={"fc9.weight"},
        )
    with pytest.raises(ValueError, match="no 'train' signature"):
        Trainer(mlp())


def test_trainer_rejects_bad_feeds():
    from sporenet.lite import InputError

    trainer = Trainer(
        make_training_model(
            mlp(), output="logits", loss="softmax_cross_entropy", optimizer=OptimizerConfig()
        )
    )
    x, y = separable(8)
    with pytest.raises(InputError, match="missing"):
        trainer.step({"x": x}, 0.1)
    with pytest.raises(InputError, match="shape"):
        trainer.step({"x": x[:, :3], "labels": y}, 0.1)
    with pytest.raises(InputError, match="expected int64"):
        trainer.step({"x": x, "labels": y.astype(np.float32)}, 0.1)
    with pytest.raises(InputError, match=r"class ids in \[0, 3\)"):
        trainer.step({"x": x, "labels": np.full(8, 3, np.int64)}, 0.1)
    with pytest.raises(InputError, match="class ids"):
        trainer.step({"x": x, "labels": np.full(8, -1, np.int64)}, 0.1)


def test_schedules():
    step = StepLR(0.1, step_size=10, gamma=0.5)
    assert step(0) == 0.1 and step(10) == 0.05 and step(25) == 0.025
    cos = CosineLR(0.1, total_steps=100, min_lr=0.001)
    assert cos(0) == pytest.approx(0.1) and cos(100) == pytest.approx(0.001)
    assert cos(50) == pytest.approx(0.0505)
    warm = WarmUp(cos, warmup_steps=5)
    assert warm(0) == pytest.approx(cos(5) / 5) and warm(4) == pytest.approx(cos(5))
    assert warm(60) == cos(60)


def cnn(seed=0):
    """Conv -> BatchNorm -> Relu -> MaxPool -> Flatten -> FC on (N, 1, 6, 6) images."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, 1, 6, 6))
    w = b.constant("conv.weight", rng.normal(size=(4, 1, 3, 3)) * 0.5, np.float32)
    h = b.op(OpCode.CONV2D, [x, w], pads=[1, 1, 1, 1])
    bn = [
        b.constant(f"bn.{k}", v.astype(np.float32))
        for k, v in (
            ("weight", np.ones(4)),
            ("bias", np.zeros(4)),
            ("running_mean", np.zeros(4)),
            ("running_var", np.ones(4)),
        )
    ]
    h = b.op(OpCode.BATCH_NORM, [h, *bn])
    h = b.op(OpCode.RELU, [h])
    h = b.op(OpCode.MAX_POOL2D, [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.op(OpCode.FLATTEN, [h])
    fw = b.constant("fc.weight", rng.normal(size=(2, 36)) * 0.2, np.float32)
    fb = b.constant("fc.bias", np.zeros(2), np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, fw, fb]), "logits")
    return b.build()


def bars(n=128, seed=2):
    """Images with a horizontal (class 0) or vertical (class 1) bar plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(scale=0.3, size=(n, 1, 6, 6)).astype(np.float32)
    pos = rng.integers(0, 6, n)
    for k in range(n):
        if y[k]:
            x[k, 0, :, pos[k]] += 2
        else:
            x[k, 0, pos[k], :] += 2
    return x, y.astype(np.int64)


def test_cnn_with_batch_norm_trains_and_updates_running_statistics():
    x, y = bars()
    model = make_training_model(
        cnn(),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
    )
    ops = [n.op for n in model.graphs[model.signature("train").graph].nodes]
    assert OpCode.BATCH_NORM_TRAINING in ops and OpCode.BATCH_NORM not in ops
    trainer = Trainer(model)
    losses = [
        trainer.step({"x": x[k : k + 32], "labels": y[k : k + 32]}, 0.1)
        for _ in range(8)
        for k in range(0, len(x), 32)
    ]
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    stats = trainer.weights()
    assert not np.allclose(stats["bn.running_mean"], 0)  # updated by the train graph
    accuracy = (trainer.evaluate({"x": x})["logits"].argmax(1) == y).mean()
    assert accuracy > 0.9
    exported = trainer.export()
    assert OpCode.BATCH_NORM in [n.op for n in exported.graphs[0].nodes]
    np.testing.assert_array_equal(exported.weights()["bn.running_var"], stats["bn.running_var"])
    out = Interpreter(model=exported).run({"x": x})["logits"]
    np.testing.assert_allclose(out, trainer.evaluate({"x": x})["logits"], rtol=1e-5, atol=1e-5)


def test_frozen_backbone_batch_norm_stays_in_inference_form():
    x, y = bars(32)
    base = cnn()
    model = make_training_model(
        base,
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("adam", lr=0.01),
        trainable={"fc.weight", "fc.bias"},
    )
    ops = [n.op for n in model.graphs[model.signature("train").graph].nodes]
    assert OpCode.BATCH_NORM in ops and OpCode.BATCH_NORM_TRAINING not in ops
    # Only the head's gradients are computed: no backward op for the conv at all.
    assert OpCode.CONV2D_BACKPROP_FILTER not in ops and OpCode.CONV2D_BACKPROP_INPUT not in ops
    trainer = Trainer(model)
    for _ in range(3):
        trainer.step({"x": x, "labels": y}, 0.01)
    exported = trainer.export().weights()
    for name in ("conv.weight", "bn.running_mean", "bn.running_var", "bn.weight"):
        assert exported[name].tobytes() == base.weights()[name].tobytes()


def test_batch_norm_on_features_with_a_dynamic_batch():
    # (N, C) BatchNorm: shape inference plans the dynamic batch as 1, which must not fail.
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    h = b.op(
        OpCode.FULLY_CONNECTED, [x, b.constant("fc1.weight", rng.normal(size=(8, 4)), np.float32)]
    )
    bn = [
        b.constant(f"bn.{k}", v.astype(np.float32))
        for k, v in (
            ("weight", np.ones(8)),
            ("bias", np.zeros(8)),
            ("mean", np.zeros(8)),
            ("var", np.ones(8)),
        )
    ]
    h = b.op(OpCode.RELU, [b.op(OpCode.BATCH_NORM, [h, *bn])])
    b.output(
        b.op(
            OpCode.FULLY_CONNECTED,
            [h, b.constant("fc2.weight", rng.normal(size=(3, 8)) * 0.3, np.float32)],
        ),
        "logits",
    )
    model = make_training_model(
        b.build(),
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
    )
    xs, ys = separable()
    trainer = Trainer(model)
    losses = [trainer.step({"x": xs, "labels": ys}, 0.1) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0]
    assert (trainer.evaluate({"x": xs})["logits"].argmax(1) == ys).mean() > 0.85


def test_default_trainable_is_flagged_tensors_or_else_weights_only():
    # Unflagged model (as the converter writes them): weights of FC/Conv/BatchNorm train;
    # argument constants (here BatchNorm running statistics) do not.
    model = cnn()
    assert not any(t.trainable for t in model.tensors)
    train = make_training_model(
        model, output="logits", loss="softmax_cross_entropy", optimizer=OptimizerConfig()
    )
    trained = {train.tensors[i].name for i in Trainer(train)._params}
    assert trained == {"conv.weight", "bn.weight", "bn.bias", "fc.weight", "fc.bias"}
    # Flagged tensors win: only they train.
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    w = b.constant("w", np.ones((3, 4), np.float32), trainable=True)
    frozen = b.constant("frozen", np.ones((3, 3), np.float32))
    h = b.op(OpCode.CLIP, [b.op(OpCode.FULLY_CONNECTED, [x, w])], min=0.0, max=6.0)
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, frozen]), "logits")
    flagged = make_training_model(
        b.build(), output="logits", loss="mse", optimizer=OptimizerConfig()
    )
    assert {flagged.tensors[i].name for i in Trainer(flagged)._params} == {"w"}


def test_on_device_fine_tuning_of_a_memory_mapped_model_file(tmp_path):
    # The device flow: load a .spore file (read-only memory map), train the head, save.
    from sporenet.lite import load, save

    x, y = bars(64)
    path = save(cnn(), tmp_path / "base.spore")
    base = load(path)
    model = make_training_model(
        base,
        output="logits",
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.05, momentum=0.9),
        trainable={"fc.weight", "fc.bias"},
    )
    trainer = Trainer(model, num_threads=1)
    first = trainer.step({"x": x, "labels": y}, 0.05)
    for _ in range(15):
        last = trainer.step({"x": x, "labels": y}, 0.05)
    assert last < first
    tuned = load(save(trainer.export(), tmp_path / "tuned.spore"))
    before, after = load(path).weights(), tuned.weights()
    assert after["conv.weight"].tobytes() == before["conv.weight"].tobytes()
    assert not np.array_equal(after["fc.weight"], before["fc.weight"])
    out = Interpreter(model_path=tmp_path / "tuned.spore").run({"x": x})["logits"]
    np.testing.assert_allclose(out, trainer.evaluate({"x": x})["logits"], rtol=1e-5, atol=1e-5)


def conv_relu_pool(seed=0, padded=False, fused=False):
    """Conv2D, a RELU (fused into the conv if asked), then a 2x2 MAX_POOL2D (stride 1
    and padded if asked)."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, 1, 6, 6))
    w = b.constant("conv.weight", rng.normal(size=(3, 1, 3, 3)) * 0.5, np.float32)
    bias = b.constant("conv.bias", rng.normal(size=3) * 0.1, np.float32)
    if fused:
        h = b.op(OpCode.CONV2D, [x, w, bias], pads=[1, 1, 1, 1], activation="relu")
    else:
        h = b.op(OpCode.RELU, [b.op(OpCode.CONV2D, [x, w, bias], pads=[1, 1, 1, 1])])
    pool = {"strides": [1, 1], "pads": [1, 1, 0, 0]} if padded else {"strides": [2, 2]}
    h = b.op(OpCode.MAX_POOL2D, [h], kernel_shape=[2, 2], **pool)
    side = 6 if padded else 3
    flat = b.op(OpCode.RESHAPE, [h], shape=[-1, 3 * side * side])
    w2 = b.constant("fc.weight", rng.normal(size=(2, 3 * side * side)) * 0.3, np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [flat, w2]), "logits")
    return b.build()


@pytest.mark.parametrize(("padded", "fused"), [(False, False), (True, False), (False, True)])
def test_relu_before_max_pool_moves_after_it_with_bit_identical_training(
    monkeypatch, padded, fused
):
    from sporenet.lite.training import model as training_model

    rng = np.random.default_rng(3)
    # Integer-valued inputs, so pooling windows hold ties (zeros after the ReLU included).
    x = rng.integers(-2, 3, size=(16, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 2, size=16).astype(np.int64)

    def train():
        model = make_training_model(
            conv_relu_pool(padded=padded, fused=fused),
            output="logits",
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
        )
        trainer = Trainer(model, num_threads=1)
        losses = [trainer.step({"x": x, "labels": y}, 0.1) for _ in range(5)]
        return model, losses, trainer.weights()

    model, losses, weights = train()
    nodes = model.graphs[model.signature("train").graph].nodes
    ops = [n.op for n in nodes]
    assert ops.index(OpCode.MAX_POOL2D) < ops.index(OpCode.RELU)
    # The ReLU's gradient is folded into the pool's, and from there into the routing
    # mask (positive_only=1, the gradient then relu=0): no ACTIVATION_GRAD is left.
    assert OpCode.ACTIVATION_GRAD not in ops
    assert nodes[ops.index(OpCode.MAX_POOL2D_GRAD)].attrs["relu"] == 0
    assert nodes[ops.index(OpCode.MAX_POOL2D)].attrs["positive_only"] == 1
    forward = nodes[: ops.index(OpCode.SOFTMAX_CROSS_ENTROPY)]
    assert all(n.attrs.get("activation", "none") == "none" for n in forward)
    monkeypatch.setattr(training_model, "_pool_before_relu", lambda m, nodes, kept, new: nodes)
    model, unswapped_losses, unswapped = train()
    ops = [n.op for n in model.graphs[model.signature("train").graph].nodes]
    assert (
        OpCode.RELU not in ops if fused else ops.index(OpCode.RELU) < ops.index(OpCode.MAX_POOL2D)
    )
    assert losses == unswapped_losses
    for name, value in weights.items():
        np.testing.assert_array_equal(value, unswapped[name], err_msg=name)


@pytest.mark.parametrize(("padded", "fused"), [(False, False), (True, False), (False, True)])
def test_max_pool_routing_mask_trains_bit_identically_through_a_spore_file(
    monkeypatch, tmp_path, padded, fused
):
    # The training forward's MAX_POOL2D emits its routing mask (routing=1, output 1) and
    # MAX_POOL2D_GRAD reads it: the graph survives a .spore round trip and trains exactly
    # as the gradient that walks x and y itself (ties included: integer inputs).
    from sporenet.lite import load, save
    from sporenet.lite.training import model as training_model

    rng = np.random.default_rng(4)
    x = rng.integers(-2, 3, size=(16, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 2, size=16).astype(np.int64)

    def make():
        return make_training_model(
            conv_relu_pool(padded=padded, fused=fused),
            output="logits",
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
        )

    def train(model):
        trainer = Trainer(model, num_threads=1)
        return [trainer.step({"x": x, "labels": y}, 0.1) for _ in range(5)], trainer.weights()

    model = load(save(make(), tmp_path / "train.spore"))
    nodes = model.graphs[model.signature("train").graph].nodes
    (pool,) = [n for n in nodes if n.op == OpCode.MAX_POOL2D]
    (grad,) = [n for n in nodes if n.op == OpCode.MAX_POOL2D_GRAD]
    assert pool.attrs["routing"] == 1 and grad.inputs[3] == pool.outputs[1]
    assert model.tensors[pool.outputs[1]].dtype == np.bool_
    losses, weights = train(model)
    monkeypatch.setattr(training_model, "_routing_pool", lambda m, n, new_tensor: n)
    walked = make()
    nodes = walked.graphs[walked.signature("train").graph].nodes
    assert all(len(n.inputs) == 3 for n in nodes if n.op == OpCode.MAX_POOL2D_GRAD)
    walked_losses, walked_weights = train(walked)
    assert losses == walked_losses
    for name, value in weights.items():
        np.testing.assert_array_equal(value, walked_weights[name], err_msg=name)


@pytest.mark.parametrize(("padded", "fused"), [(False, False), (True, False), (False, True)])
def test_relu_derivative_in_the_routing_mask_trains_bit_identically(monkeypatch, padded, fused):
    # positive_only=1 routes only positive maxima, so the gradient's own y > 0 pass goes:
    # the same losses and weights as MAX_POOL2D_GRAD applying relu=1 to a full mask.
    from sporenet.lite.training import model as training_model

    rng = np.random.default_rng(5)
    x = rng.integers(-2, 3, size=(16, 1, 6, 6)).astype(np.float32)  # ties, maxima <= 0
    y = rng.integers(0, 2, size=16).astype(np.int64)

    def train():
        model = make_training_model(
            conv_relu_pool(padded=padded, fused=fused),
            output="logits",
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
        )
        nodes = model.graphs[model.signature("train").graph].nodes
        (pool,) = [n for n in nodes if n.op == OpCode.MAX_POOL2D]
        (grad,) = [n for n in nodes if n.op == OpCode.MAX_POOL2D_GRAD]
        trainer = Trainer(model, num_threads=1)
        losses = [trainer.step({"x": x, "labels": y}, 0.1) for _ in range(5)]
        return (pool.attrs.get("positive_only", 0), grad.attrs["relu"]), losses, trainer.weights()

    folded, losses, weights = train()
    monkeypatch.setattr(training_model, "_relu_into_routing_masks", lambda nodes: nodes)
    apart, apart_losses, apart_weights = train()
    assert (folded, apart) == ((1, 0), (0, 1))
    assert losses == apart_losses
    for name, value in weights.items():
        np.testing.assert_array_equal(value, apart_weights[name], err_msg=name)
