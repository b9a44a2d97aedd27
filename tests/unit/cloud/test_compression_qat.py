"""Quantization-aware training end to end on a small CNN: BatchNorm folded exactly,
fake-quant layers inserted and calibrated, ranges learned in eager and graph mode, and the
int8 export (through the converter's quantizer) agreeing with the QAT model."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import compression as C
from sporenet.cloud import layers as L
from sporenet.cloud.errors import ConfigError
from sporenet.lite import Interpreter, OpCode, parse

pytest.importorskip(
    "sklearn", reason="the digits data ships with scikit-learn (the optional `datasets` extra)"
)
DATA = cloud.load_digits()
X, Y = DATA.x_train[:400], DATA.y_train[:400]


def trained_cnn() -> cloud.Sequential:
    cloud.manual_seed(1)
    model = cloud.Sequential(
        L.Rescale(1 / 16),
        L.Conv2d(1, 8, 3, padding=1, bias=False),
        L.BatchNorm2d(8),
        L.ReLU(),
        L.MaxPool2d(2),
        L.Flatten(),
        L.Dense(8 * 4 * 4, 10),
    )
    cloud.fit(
        model, X, Y, epochs=3, batch_size=32, optimizer=cloud.Adam(lr=1e-2), verbose=0, mode="graph"
    )
    return model


MODEL = trained_cnn()


def test_batch_norm_folding_is_exact():
    folded = C.fold_batch_norms(MODEL)
    assert not any(isinstance(m, L.BatchNorm2d) for _, m in folded.named_modules())
    np.testing.assert_allclose(folded(X[:64]), MODEL(X[:64]), rtol=1e-4, atol=1e-4)


def test_prepare_inserts_fake_quant_and_calibrates_ranges():
    qat = C.prepare_qat(MODEL, X[:200])
    kinds = [type(m).__name__ for m in qat]
    assert kinds == [
        "Rescale",
        "FakeQuant",
        "WeightFakeQuant",
        "ReLU",
        "FakeQuant",
        "MaxPool2d",
        "Flatten",
        "WeightFakeQuant",
        "FakeQuant",
    ]
    ranges = list(C.range_of(qat).values())
    assert ranges[0] == pytest.approx((0.0, 1.0))  # pixels 0..16 rescaled
    assert ranges[1][0] == 0.0 and ranges[1][1] > 0  # after ReLU
    # int8 rounding changes the float model's outputs a little, not its predictions.
    agree = np.mean(qat(X).argmax(1) == MODEL(X).argmax(1))
    assert agree > 0.97
    assert not np.array_equal(qat(X[:8]), MODEL(X[:8]))  # the rounding is really there
    with pytest.raises(ConfigError, match="Sequential"):
        C.prepare_qat(L.Dense(4, 2), X[:10])


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_qat_learns_ranges_and_exports_int8(mode):
    qat = C.prepare_qat(MODEL, X[:200])
    before = C.range_of(qat)
    cloud.fit(
        qat, X, Y, epochs=1, batch_size=32, optimizer=cloud.Adam(lr=1e-3), verbose=0, mode=mode
    )
    after = C.range_of(qat)
    assert after != before  # the straight-through gradient reached the ranges
    result = C.export_int8(qat, X[:100])
    model = parse(result.data)
    ops = {n.op for n in model.graphs[0].nodes}
    assert OpCode.FAKE_QUANT not in ops and OpCode.QUANTIZE in ops
    assert any(t.dtype == np.int8 and t.data is not None for t in model.tensors)
    logits = Interpreter(model_content=result.data).run({"input": DATA.x_test})["logits"]
    want = qat(DATA.x_test)
    assert np.mean(logits.argmax(1) == want.argmax(1)) > 0.97


def test_strip_fake_quant_keeps_ranges_by_tensor_name():
    qat = C.prepare_qat(MODEL, X[:200])
    ir = cloud.to_inference_ir(qat)
    names = {t.name for t in ir.tensors}
    ranges = C.strip_fake_quant(ir)
    # Three fake-quant ranges, the ReLU's also on the max-pool and flatten outputs.
    assert len(ranges) == 5 and set(ranges) <= names
    assert all(n.op != OpCode.FAKE_QUANT for n in ir.graphs[0].nodes)
    # Without the fake-quant nodes the graph is the folded float model.
    folded = C.fold_batch_norms(MODEL)
    out = Interpreter(model=ir).run({"input": X[:32]})["logits"]
    np.testing.assert_allclose(out, folded(X[:32]), rtol=1e-4, atol=1e-4)
