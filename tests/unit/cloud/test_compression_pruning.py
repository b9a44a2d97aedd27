"""Magnitude pruning: the polynomial schedule's values, masks per layer and global, masks
held through optimizer steps and fine-tuning in both modes, and the sparse export."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import compression as C
from sporenet.cloud import layers as L
from sporenet.cloud.errors import ConfigError
from sporenet.lite import Interpreter, load

pytest.importorskip(
    "sklearn", reason="the digits data ships with scikit-learn (the optional `datasets` extra)"
)
DATA = cloud.load_digits()
X, Y = DATA.x_train[:320], DATA.y_train[:320]


def small_cnn(seed: int = 0) -> cloud.Sequential:
    cloud.manual_seed(seed)
    return cloud.Sequential(
        L.Rescale(1 / 16),
        L.Conv2d(1, 8, 3, padding=1),
        L.ReLU(),
        L.MaxPool2d(2),
        L.Flatten(),
        L.Dense(8 * 4 * 4, 10),
    )


def test_polynomial_schedule_values():
    s = C.PolynomialSparsity(0.8, begin_step=10, end_step=110, initial=0.2, power=3)
    assert s(0) == s(10) == pytest.approx(0.2)
    assert s(110) == s(500) == pytest.approx(0.8)
    # Halfway: 0.8 + (0.2 - 0.8) * 0.5^3.
    assert s(60) == pytest.approx(0.8 - 0.6 * 0.125)
    values = [s(t) for t in range(0, 130, 5)]
    assert values == sorted(values)
    with pytest.raises(ConfigError, match="end_step"):
        C.PolynomialSparsity(0.5, begin_step=10, end_step=10)
    with pytest.raises(ConfigError, match="final"):
        C.PolynomialSparsity(1.0, begin_step=0, end_step=10)


def test_layer_and_global_masks():
    rng = np.random.default_rng(0)
    weights = {"a": rng.normal(size=(10, 10)), "b": 10 * rng.normal(size=(30,))}
    per_layer = C.magnitude_masks(weights, 0.5)
    assert per_layer["a"].sum() == 50 and per_layer["b"].sum() == 15
    # The smallest are the ones pruned.
    assert np.abs(weights["a"][~per_layer["a"]]).max() < np.abs(weights["a"][per_layer["a"]]).min()
    both = C.magnitude_masks(weights, 0.5, scope="global")
    assert both["a"].sum() + both["b"].sum() == 65
    assert both["b"].sum() > 15  # the large-magnitude tensor keeps more
    with pytest.raises(ConfigError, match="scope"):
        C.magnitude_masks(weights, 0.5, scope="row")


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_masks_hold_through_optimizer_steps_and_fine_tuning(mode):
    model = small_cnn()
    pruning = C.Pruning(C.PolynomialSparsity(0.75, begin_step=0, end_step=20), frequency=5)
    # Adam with momentum moves every weight each step unless the mask is re-applied.
    cloud.fit(
        model,
        X,
        Y,
        epochs=3,
        batch_size=32,
        optimizer=cloud.Adam(lr=1e-2),
        callbacks=[pruning],
        verbose=0,
        mode=mode,
    )
    names = list(C.prunable_weights(model))
    assert names == ["1.weight", "5.weight"]
    params = dict(model.named_parameters())
    for name in names:
        mask = pruning.masks[name]
        assert 1 - mask.mean() == pytest.approx(0.75, abs=0.02)
        assert not params[name].value[~mask].any()
    # Fine-tuning with the same callback keeps exactly the same weights at zero.
    before = {n: pruning.masks[n].copy() for n in names}
    cloud.fit(
        model,
        X,
        Y,
        epochs=2,
        batch_size=32,
        optimizer=cloud.Adam(lr=1e-2),
        callbacks=[pruning],
        verbose=0,
        mode=mode,
    )
    for name in names:
        np.testing.assert_array_equal(pruning.masks[name], before[name])
        np.testing.assert_array_equal(params[name].value != 0, before[name])


def test_sparse_export_reads_back_equal_and_smaller(tmp_path):
    model = small_cnn()
    cloud.fit(model, X, Y, epochs=1, batch_size=64, verbose=0, mode="graph")
    masks = C.prune_now(model, 0.8)
    assert C.sparsity_of(C.prunable_weights(model).values()) == pytest.approx(0.8, abs=0.01)
    dense = cloud.export(model, tmp_path / "dense.spore")
    C.export_sparse(model, tmp_path / "sparse.spore")
    saved = (tmp_path / "dense.spore").stat().st_size - (tmp_path / "sparse.spore").stat().st_size
    # 80% of the pruned weights' bytes go, less one mask bit per weight and alignment (the
    # header is most of a file this small; the digits script measures whole files).
    pruned_bytes = sum(w.nbytes for w in C.prunable_weights(model).values())
    assert saved > 0.65 * pruned_bytes
    loaded = load(tmp_path / "sparse.spore")
    for t in dense.tensors:
        if t.data is not None:
            np.testing.assert_array_equal(loaded.tensors[loaded.tensor_index(t.name)].data, t.data)
    assert any(t.sparsity is not None for t in loaded.tensors)
    x = DATA.x_test[:50]
    want = Interpreter(model_path=tmp_path / "dense.spore").run({"input": x})["logits"]
    got = Interpreter(model_path=tmp_path / "sparse.spore").run({"input": x})["logits"]
    np.testing.assert_array_equal(got, want)
    assert set(masks) == {"1.weight", "5.weight"}


def test_unknown_weight_names_are_refused():
    with pytest.raises(ConfigError, match=r"cannot prune unknown weights \['nope'\]"):
        cloud.fit(
            small_cnn(),
            X,
            Y,
            epochs=1,
            verbose=0,
            callbacks=[
                C.Pruning(C.PolynomialSparsity(0.5, begin_step=0, end_step=5), weights=["nope"])
            ],
        )


def test_sparse_int8_equals_the_dense_int8_model(tmp_path):
    from sporenet.converter.quantize import quantize_model
    from sporenet.lite import parse

    model = small_cnn()
    cloud.fit(model, X, Y, epochs=1, batch_size=64, verbose=0, mode="graph")
    C.prune_now(model, 0.8)
    data = C.sparse_int8(model, X[:64], path=tmp_path / "m.spore")
    assert (tmp_path / "m.spore").read_bytes() == data
    dense = quantize_model(
        cloud.inference_model(model), calibration={"input": X[:64]}, report=False
    )
    assert len(data) < len(dense.data)
    sparse_ir = parse(data)
    stored = [t for t in sparse_ir.tensors if t.sparsity is not None]
    assert stored and all(t.dtype == np.int8 and t.quantization is not None for t in stored)
    x = DATA.x_test[:40]
    want = Interpreter(model_content=dense.data).run({"input": x})["logits"]
    np.testing.assert_array_equal(Interpreter(model_content=data).run({"input": x})["logits"], want)
