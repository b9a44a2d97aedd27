"""Which pages of a memory-mapped model stay resident: weights a kernel packs or
transforms leave memory once planned (and stay out after runs), weights the steps read in
place stay mapped, and the outputs still match a float64 reference.

Residency is read from /proc/self/pagemap (the "present" bit of each page of this
process), so the file tests run on Linux only.
"""

from __future__ import annotations

import mmap
import struct
import sys

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode, pages, save

RNG = np.random.default_rng(11)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="page residency is read from /proc"
)


def _resident(array: np.ndarray) -> float:
    """Fraction of the pages lying wholly inside `array` that are mapped in this process."""
    page = mmap.PAGESIZE
    lo = -(-array.ctypes.data // page)
    hi = (array.ctypes.data + array.nbytes) // page
    assert hi > lo, "the array spans no whole page"
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo * 8)
        entries = struct.unpack(f"<{hi - lo}Q", f.read((hi - lo) * 8))
    return sum(e >> 63 for e in entries) / (hi - lo)


def _conv(x: np.ndarray, w: np.ndarray, b=None, *, pad: int = 0, stride: int = 1) -> np.ndarray:
    """Direct NCHW cross-correlation in float64."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[2] - kh) // stride + 1
    ow = (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def _three_layers():
    """A Winograd layer, a strided im2col layer with a bias (both pack their weights at
    bind) and a 1x1 layer whose GEMM reads its weights in place: megabytes each, so most
    of their pages lie wholly inside them."""
    w1 = (RNG.normal(size=(256, 256, 3, 3)) * 0.02).astype(np.float32)
    w2 = (RNG.normal(size=(256, 256, 3, 3)) * 0.02).astype(np.float32)
    b2 = RNG.normal(size=256).astype(np.float32)
    w3 = (RNG.normal(size=(512, 256, 1, 1)) * 0.05).astype(np.float32)
    b = ModelBuilder()
    x = b.input("x", (1, 256, 12, 12))
    y = b.op(OpCode.CONV2D, [x, b.constant("w1", w1)], pads=[1, 1, 1, 1])
    y = b.op(
        OpCode.CONV2D,
        [y, b.constant("w2", w2), b.constant("b2", b2)],
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    y = b.op(OpCode.CONV2D, [y, b.constant("w3", w3)])
    b.output(y, name="y")

    def reference(v: np.ndarray) -> np.ndarray:
        r = _conv(v, w1, pad=1)
        r = _conv(r, w2, b2, pad=1, stride=2)
        return _conv(r, w3)

    return b.build(), reference


def test_packed_weights_leave_memory_and_kept_ones_stay(tmp_path):
    model, reference = _three_layers()
    interp = Interpreter(model_path=save(model, tmp_path / "convs.spore"), num_threads=1)
    strategies = [k.strategy for k in interp._plan.kernels]
    assert strategies[0].startswith("winograd") and strategies[1:] == ["im2col", "pointwise"]
    weights = {
        name: interp.model.tensors[interp.model.tensor_index(name)].data
        for name in ["w1", "w2", "w3"]
    }
    x = RNG.normal(size=(1, 256, 12, 12)).astype(np.float32)
    for _ in range(2):
        got = interp.run({"x": x})["y"]
    np.testing.assert_allclose(got, reference(x), rtol=1e-3, atol=1e-3)
    # A page fault may map up to a few neighbouring pages of the file (fault-around), so
    # the bounds leave room at the edges; without the release nearly every page is mapped.
    assert _resident(weights["w1"]) < 0.2, "Winograd's source weights stayed resident"
    assert _resident(weights["w2"]) < 0.2, "im2col's packed-away weights stayed resident"
    assert _resident(weights["w3"]) > 0.9, "the 1x1 layer's weights are read in place"


def test_release_unless_read_keeps_weights_a_view_still_reads(tmp_path):
    data = RNG.normal(size=(256, 1024)).astype(np.float32)
    path = tmp_path / "raw.bin"
    path.write_bytes(data.tobytes())
    with path.open("rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    w = np.frombuffer(mapped, np.float32).reshape(256, 1024)
    w.sum()  # fault every page in
    assert _resident(w) == 1.0
    pages.release_unless_read(w, w.reshape(1024, 256), np.zeros(3))
    assert _resident(w) == 1.0, "a step reading a view of the weights keeps them"
    packed = np.ascontiguousarray(w.T)
    pages.release_unless_read(w, packed)
    assert _resident(w) == 0.0, "weights packed into a copy are dropped"
    np.testing.assert_array_equal(w, data)  # and read back from the file when touched


def test_a_constant_only_folded_nodes_read_leaves_memory(tmp_path):
    # A float16 weight widened by a CAST (as converted TFLite models store them): the CAST
    # is folded when the model is planned, so nothing at run time reads the float16 pages.
    w16 = (RNG.normal(size=(512, 512)) * 0.05).astype(np.float16)
    b = ModelBuilder()
    x = b.input("x", (2, 512))
    w = b.op(OpCode.CAST, [b.constant("w16", w16)], to="float32")
    b.output(b.op(OpCode.MATMUL, [x, b.op(OpCode.TRANSPOSE, [w], perm=[1, 0])]), name="y")
    interp = Interpreter(model_path=save(b.build(), tmp_path / "f16.spore"), num_threads=1)
    v = RNG.normal(size=(2, 512)).astype(np.float32)
    got = interp.run({"x": v})["y"]
    np.testing.assert_allclose(got, v @ w16.astype(np.float32).T, rtol=1e-5, atol=1e-5)
    stored = interp.model.tensors[interp.model.tensor_index("w16")].data
    assert _resident(stored) < 0.2, "the float16 pages stayed resident beside their widening"


def test_a_widened_weight_a_kernel_packs_is_not_kept_twice(tmp_path):
    # CAST(float16) -> a 3x3 convolution that packs its weights (im2col with a bias): the
    # plan forgets the widened float32 value once the layer is bound; outputs unchanged.
    w16 = (RNG.normal(size=(64, 32, 3, 3)) * 0.05).astype(np.float16)
    bias = RNG.normal(size=64).astype(np.float32)
    b = ModelBuilder()
    x = b.input("x", (1, 32, 10, 10))
    w = b.op(OpCode.CAST, [b.constant("w16", w16)], to="float32")
    b.output(
        b.op(OpCode.CONV2D, [x, w, b.constant("bias", bias)], pads=[1, 1, 1, 1], strides=[2, 2]),
        name="y",
    )
    model = b.build()
    interp = Interpreter(model_path=save(model, tmp_path / "conv16.spore"), num_threads=1)
    widened = next(n.outputs[0] for n in model.graphs[0].nodes if n.op == OpCode.CAST)
    assert widened not in interp._plan.arrays, "the plan kept the widened weights"
    v = RNG.normal(size=(1, 32, 10, 10)).astype(np.float32)
    got = interp.run({"x": v})["y"]
    want = _conv(v, w16.astype(np.float32), bias, pad=1, stride=2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_small_packed_weights_stay_out_after_later_layers_are_planned(tmp_path):
    # Many small packed weights lie side by side in the file. A page fault maps its
    # neighbours too (fault-around), so reading one layer's weights maps back the pages of
    # layers planned before it; the plan drops them all once every layer is bound.
    layers = [
        (
            (RNG.normal(size=(48, 48, 1, 3)) * 0.1).astype(np.float32),
            RNG.normal(size=48).astype(np.float32),
        )
        for _ in range(16)
    ]
    b = ModelBuilder()
    y = b.input("x", (1, 48, 10, 10))
    for k, (w, bias) in enumerate(layers):
        y = b.op(
            OpCode.CONV2D,
            [y, b.constant(f"w{k}", w), b.constant(f"b{k}", bias)],
            pads=[0, 1, 0, 1],
        )
    b.output(y, name="y")
    interp = Interpreter(model_path=save(b.build(), tmp_path / "small.spore"), num_threads=1)
    v = (RNG.normal(size=(1, 48, 10, 10)) * 0.5).astype(np.float32)
    got = interp.run({"x": v})["y"]
    want = v.astype(np.float64)
    for w, bias in layers:
        want = _conv(np.pad(want, ((0, 0), (0, 0), (0, 0), (1, 1))), w, bias)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    stored = [interp.model.tensors[interp.model.tensor_index(f"w{k}")].data for k in range(16)]
    resident = np.mean([_resident(w) for w in stored])
    assert resident < 0.2, f"{resident:.0%} of the packed weights' pages stayed resident"


def test_int8_conv_weights_a_folded_step_replaces_leave_memory(tmp_path):
    """A streaming int8 conv (one output position) whose step reads float64 folded weights
    gives the file's int8 weights back; the output is the int64 reference's."""
    from tests.unit.lite.quantized_reference import quant, random_q
    from tests.unit.lite.test_quantized_core import conv_reference

    rng = np.random.default_rng(12)
    o, c, k = 64, 40, 5  # 12.8 KB of int8 weights: three whole pages at least
    x = random_q(rng, (1, c, k, 1), np.int8)
    w = rng.integers(-40, 41, (o, c, k, 1)).astype(np.int8)
    sw, bias = rng.uniform(0.001, 0.01, o), rng.integers(-5000, 5000, o).astype(np.int32)
    b = ModelBuilder()
    xi = b.quantize(b.input("x", x.shape, x.dtype), 0.02, 3)
    wi = b.constant("w", w, quantization=quant(sw, 0, 0))
    y = b.op(OpCode.CONV2D, [xi, wi, b.constant("b", bias)])
    b.output(b.quantize(y, 0.4, -5, dtype=np.int8), "y")
    interp = Interpreter(model_path=save(b.build(), tmp_path / "stream.spore"), num_threads=1)
    assert [k.fold is not None for k in interp._plan.step_kernels if hasattr(k, "fold")] == [True]
    data = interp.model.tensors[interp.model.tensor_index("w")].data
    for _ in range(3):
        got = interp.run({"x": x})["y"]
    want = conv_reference(x, 3, 0.02, w, sw, bias, 0.4, -5, -128, 127, (0,) * 4, (1, 1), 1)
    np.testing.assert_array_equal(got, want)
    assert _resident(data) < 0.5, "the folded layer's int8 source weights stayed resident"


def test_widened_weights_are_freed_as_their_layers_are_bound(tmp_path, monkeypatch):
    # Four CAST(float16) -> packed 3x3 convolutions: when a layer is bound, the widened
    # float32 values of the layers bound before it are gone (the plan never holds every
    # widened weight beside every packed one); outputs match the float64 reference.
    import weakref

    from sporenet.lite import planner
    from sporenet.lite.kernels import KERNELS

    weights = [(RNG.normal(size=(32, 32, 3, 3)) * 0.05).astype(np.float16) for _ in range(4)]
    b = ModelBuilder()
    y = b.input("x", (1, 32, 12, 12))
    for k, w16 in enumerate(weights):
        w = b.op(OpCode.CAST, [b.constant(f"w{k}", w16)], to="float32")
        bias = b.constant(f"b{k}", np.full(32, 0.1, np.float32))
        y = b.op(OpCode.CONV2D, [y, w, bias], pads=[1, 1, 1, 1])
    b.output(y, name="y")
    path = save(b.build(), tmp_path / "f16s.spore")
    widened: list[weakref.ref] = []
    alive_at_bind: list[int] = []
    fold, conv = planner.fold, KERNELS[OpCode.CONV2D]

    def noting_fold(kernel):
        outs = fold(kernel)
        widened.extend(weakref.ref(v) for v in outs or ())
        return outs

    def noting_bind(self, ins, outs):
        alive_at_bind.append(sum(r() is not None for r in widened))
        return bind(self, ins, outs)

    bind = conv.bind
    monkeypatch.setattr(planner, "fold", noting_fold)
    monkeypatch.setattr(conv, "bind", noting_bind)
    interp = Interpreter(model_path=path, num_threads=1)
    assert len(widened) == 4
    assert alive_at_bind[:4] == [4, 3, 2, 1], "widened weights outlived their layer's bind"
    v = RNG.normal(size=(1, 32, 12, 12)).astype(np.float32)
    want = v.astype(np.float64)
    for w16 in weights:
        want = _conv(want, w16.astype(np.float32), np.full(32, 0.1), pad=1)
    np.testing.assert_allclose(interp.run({"x": v})["y"], want, rtol=1e-4, atol=1e-4)


def test_small_widened_weights_stay_out_after_later_layers_are_planned(tmp_path):
    # Small float16 weights side by side, each widened by a CAST that planning folds: the
    # fold drops the float16 pages, and reading the next layer's weights maps them back
    # (fault-around) unless the finished plan drops them again.
    layers = [(RNG.normal(size=(48, 48, 1, 3)) * 0.1).astype(np.float16) for _ in range(16)]
    b = ModelBuilder()
    y = b.input("x", (1, 48, 10, 10))
    for k, w16 in enumerate(layers):
        w = b.op(OpCode.CAST, [b.constant(f"w{k}", w16)], to="float32")
        y = b.op(OpCode.CONV2D, [y, w], pads=[0, 1, 0, 1])
    b.output(y, name="y")
    interp = Interpreter(model_path=save(b.build(), tmp_path / "small16.spore"), num_threads=1)
    v = (RNG.normal(size=(1, 48, 10, 10)) * 0.5).astype(np.float32)
    got = interp.run({"x": v})["y"]
    want = v.astype(np.float64)
    for w16 in layers:
        want = _conv(np.pad(want, ((0, 0), (0, 0), (0, 0), (1, 1))), w16.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    stored = [interp.model.tensors[interp.model.tensor_index(f"w{k}")].data for k in range(16)]
    resident = np.mean([_resident(w) for w in stored])
    assert resident < 0.2, f"{resident:.0%} of the float16 weights' pages stayed resident"
