"""A converted Conv + SiLU model (SiLU fused into the Conv) trains on the device as
PyTorch trains the same network: same losses step by step, same predictions after."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, OpCode, parse, serialize
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model

onnx = pytest.importorskip("onnx")  # the onnx extra; the converter needs it
torch = pytest.importorskip("torch", reason="PyTorch (test extra) is the reference")

RNG = np.random.default_rng(12)
WEIGHTS = {
    "w": RNG.normal(size=(4, 2, 3, 3)).astype(np.float32) * 0.6,
    "b": RNG.normal(size=4).astype(np.float32) * 0.3,
    "fw": RNG.normal(size=(3, 4)).astype(np.float32),
    "fb": np.zeros(3, np.float32),
}


def conv_silu_onnx() -> bytes:
    """x (N, 2, 6, 6) -> Conv(4) -> x * Sigmoid(x) -> GlobalAveragePool -> Gemm(3)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["a"]),
        helper.make_node("GlobalAveragePool", ["a"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def torch_steps(x: np.ndarray, y: np.ndarray, lr: float, steps: int):
    conv = torch.nn.Conv2d(2, 4, 3, padding=1)
    fc = torch.nn.Linear(4, 3)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(WEIGHTS["w"]))
        conv.bias.copy_(torch.from_numpy(WEIGHTS["b"]))
        fc.weight.copy_(torch.from_numpy(WEIGHTS["fw"]))
        fc.bias.copy_(torch.from_numpy(WEIGHTS["fb"]))

    def forward(t):
        return fc(torch.nn.functional.silu(conv(t)).mean(dim=(2, 3)))

    opt = torch.optim.SGD([*conv.parameters(), *fc.parameters()], lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(xt), yt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        return losses, forward(xt).numpy()


def test_fused_silu_conv_trains_like_pytorch():
    from sporenet.converter import convert_onnx

    model = parse(convert_onnx(conv_silu_onnx()))
    convs = [n for n in model.graphs[0].nodes if n.op == OpCode.CONV2D]
    assert [n.attrs.get("activation") for n in convs] == ["silu"]
    assert OpCode.SILU not in [n.op for n in model.graphs[0].nodes]
    train = make_training_model(
        model,
        output=next(iter(model.signature().outputs)),
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig("sgd", lr=0.5),
    )
    trainer = Trainer(parse(serialize(train)))
    x = (RNG.normal(size=(16, 2, 6, 6)) * 2).astype(np.float32)
    y = RNG.integers(0, 3, size=16).astype(np.int64)
    name = next(iter(model.signature().inputs))
    losses = [trainer.step({name: x, "labels": y}, 0.5) for _ in range(6)]
    want_losses, want_logits = torch_steps(x, y, 0.5, 6)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    exported = trainer.export()
    # The inference model keeps the fused form.
    assert "silu" in [n.attrs.get("activation") for n in exported.graphs[0].nodes]
    logits = Interpreter(model=exported).run({name: x})
    np.testing.assert_allclose(next(iter(logits.values())), want_logits, rtol=1e-4, atol=1e-5)
