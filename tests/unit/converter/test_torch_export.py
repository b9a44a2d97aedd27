"""A model exported by PyTorch (the path most users take) converts and matches PyTorch."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import convert_onnx_model
from sporenet.lite import Interpreter, serialize

torch = pytest.importorskip("torch", reason="PyTorch is the torch extra")
nn = torch.nn


class MobileBlockNet(nn.Module):
    """The layer mix of a MobileNet-style classifier, plus upsampling and a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()
        )
        self.dw = nn.Sequential(
            nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.Hardswish()
        )
        self.pw = nn.Sequential(nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = y + self.pw(self.dw(y))
        y = self.pool(self.up(y))
        return torch.softmax(self.fc(torch.flatten(y, 1)), dim=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    torch.manual_seed(0)
    model = MobileBlockNet().eval()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):  # non-trivial statistics to fold
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
            module.weight.data.uniform_(0.5, 1.5)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated, still works
        torch.onnx.export(
            model,
            (torch.randn(2, 3, 32, 32),),
            buffer,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            opset_version=13,
            do_constant_folding=False,  # keep BatchNorm for the converter
            dynamic_axes={"x": {0: "N"}, "y": {0: "N"}},
        )
    path = tmp_path_factory.mktemp("torch") / "mobile.onnx"
    path.write_bytes(buffer.getvalue())
    return path, model


@pytest.mark.parametrize("optimize", [True, False])
def test_pytorch_export_matches_pytorch(exported: tuple[Path, object], optimize: bool) -> None:
    path, model = exported
    ir, report = convert_onnx_model(path, optimize=optimize)
    interpreter = Interpreter(model_content=serialize(ir))
    for batch in (1, 3):  # the batch stays dynamic
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()  # type: ignore[operator]
        got = interpreter.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    if optimize:
        ops = set(report.ir_ops_after)
        assert "BATCH_NORM" not in ops and "CLIP" not in ops and "HARD_SIGMOID" not in ops


class TinyEncoder(nn.Module):
    """Embedding, one Transformer encoder layer (attention, LayerNorm, GELU), mean, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.layer = nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, batch_first=True, activation="gelu"
        )
        self.head = nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(ids)).mean(dim=1))


def test_pytorch_transformer_encoder_with_dynamic_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated, still works
        torch.onnx.export(
            model,
            (torch.randint(0, 50, (2, 7)),),
            buffer,
            dynamo=False,
            input_names=["ids"],
            output_names=["y"],
            opset_version=17,
            dynamic_axes={"ids": {0: "N"}, "y": {0: "N"}},
        )
    path = tmp_path / "encoder.onnx"
    path.write_bytes(buffer.getvalue())
    for optimize in (True, False):
        ir, report = convert_onnx_model(path, optimize=optimize)
        interpreter = Interpreter(model_content=serialize(ir))
        for batch in (1, 3):
            ids = torch.randint(0, 50, (batch, 7))
            with torch.no_grad():
                want = model(ids).numpy()
            got = interpreter.run({"ids": ids.numpy()})["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        # Shape arithmetic on the dynamic batch is resolved at conversion, not run.
        assert "SHAPE" not in report.ir_ops_after or not optimize
