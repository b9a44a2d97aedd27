"""The runtime's footprint: weights stay views of the file, the steps' temporaries share
the plan's arena with the tensors (and stay correct when reused), weight-only
dequantization is exact in float32, and written files read back unchanged."""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, ModelFormatError, OpCode, save, serialize
from sporenet.lite.eager import run_op
from sporenet.lite.format import parse
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels import workspace
from sporenet.lite.kernels.quantized.convert import dequantize_array
from sporenet.lite.planner import _Arena, plan

RNG = np.random.default_rng(7)


def _conv_reference(x, w, b=None, *, pad=1, stride=1, group=1):
    """Direct NCHW convolution in float64 (cross-correlation, as ONNX)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    og = o // group
    for g in range(group):
        xs = xp[:, g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
                out[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, i, j]
                )
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def _conv_stack():
    """Padded convolutions on every path that takes temporaries: im2col with a bias row,
    depthwise channels-last, Winograd, im2col without bias, strided im2col."""
    w1 = RNG.normal(size=(32, 8, 3, 3)).astype(np.float32) * 0.2
    b1 = RNG.normal(size=32).astype(np.float32)
    wd = RNG.normal(size=(32, 1, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.normal(size=(32, 32, 3, 3)).astype(np.float32) * 0.1
    w3 = RNG.normal(size=(16, 32, 3, 3)).astype(np.float32) * 0.1
    w4 = RNG.normal(size=(8, 16, 3, 3)).astype(np.float32) * 0.1
    b = ModelBuilder()
    x = b.input("x", (1, 8, 20, 20))
    pads = [1, 1, 1, 1]
    y = b.op(OpCode.CONV2D, [x, b.constant("w1", w1), b.constant("b1", b1)], pads=pads)
    y = b.op(OpCode.CONV2D, [y, b.constant("wd", wd)], pads=pads, group=32)
    y = b.op(OpCode.CONV2D, [y, b.constant("w2", w2)], pads=pads)
    y = b.op(OpCode.CONV2D, [y, b.constant("w3", w3)], pads=pads)
    y = b.op(OpCode.CONV2D, [y, b.constant("w4", w4)], pads=pads, strides=[2, 2])
    b.output(y, name="y")

    def reference(v):
        r = _conv_reference(v, w1, b1)
        r = _conv_reference(r, wd, group=32)
        r = _conv_reference(r, w2)
        r = _conv_reference(r, w3)
        return _conv_reference(r, w4, stride=2)

    return b.build(), reference


def test_temporaries_reused_across_layers_stay_correct():
    model, reference = _conv_stack()
    interp = Interpreter(model=model)
    strategies = {k.strategy for k in interp._plan.kernels}
    assert {"im2col", "depthwise", "winograd4"} <= strategies or {
        "im2col",
        "depthwise",
        "winograd",
    } <= strategies
    # Several calls with different inputs: a border or ones row left stale by another
    # layer's use of the shared bytes would show here.
    for seed in range(3):
        x = np.random.default_rng(seed).normal(size=(1, 8, 20, 20)).astype(np.float32)
        got = interp.run({"x": x})["y"]
        np.testing.assert_allclose(got, reference(x), rtol=1e-4, atol=1e-4)


def test_temporaries_live_in_the_arena_not_in_each_kernel(monkeypatch):
    per_node: list[int] = []  # bytes of temporaries each node's bind asked for
    taken: list[int] = []
    temporary, release = workspace.Workspace.temporary, workspace.Workspace.release

    def recording_temporary(self, shape, dtype):
        array = temporary(self, shape, dtype)
        taken.append(array.nbytes)
        return array

    def recording_release(self):
        per_node.append(sum(taken))
        taken.clear()
        return release(self)

    monkeypatch.setattr(workspace.Workspace, "temporary", recording_temporary)
    monkeypatch.setattr(workspace.Workspace, "release", recording_release)
    model, _ = _conv_stack()
    p = plan(model)
    # The widest cut: one node's temporaries beside its input and output (32x20x20 floats
    # at most), plus alignment; private buffers would hold every node's at once.
    widest = max(per_node) + 2 * 32 * 400 * 4 + 64 * 16
    assert len([n for n in per_node if n]) >= 4
    assert p.arena_bytes <= widest < sum(per_node)


def test_temporary_outside_planning_is_a_fresh_array():
    a = workspace.temporary((3, 4), np.float32)
    assert a.shape == (3, 4) and a.dtype == np.float32 and a.base is None


def test_workspace_hands_out_views_of_taken_blocks():
    arena = _Arena(1 << 16)
    ws = workspace.Workspace(arena.take)
    with workspace.active(ws):
        a = workspace.temporary((10, 10), np.float32)
        b, refill = workspace.padded_temporary((1, 6, 6, 2), np.float32, (1, 2), (1, 5), (1, 5))
    assert np.shares_memory(a, arena.chunks[0]) and np.shares_memory(b, arena.chunks[0])
    assert not np.shares_memory(a, b)
    b.fill(7.0)
    refill()
    assert (b[:, 1:5, 1:5] == 7).all() and b.sum() == 7 * 16 * 2  # only the frame zeroed
    for block in ws.release():
        arena.give(block)
    assert arena.taken == {}


def test_a_late_temporary_shares_the_bytes_of_the_nodes_other_temporaries():
    arena = _Arena(1 << 16)
    ws = workspace.Workspace(arena.take, late=True)
    with workspace.active(ws):
        columns = workspace.temporary((64, 16), np.float32)
        late = workspace.temporary_after((32, 16), np.float32)
    assert late.array is None  # placed only once the node's temporaries are given back
    for block in ws.release():
        arena.give(block)
    for block in ws.place_late():
        arena.give(block)
    assert late.array is not None and late.array.shape == (32, 16)
    assert np.shares_memory(late.array, columns)
    assert arena.taken == {}
    eager = workspace.Workspace(arena.take)  # without `late`: placed at once
    with workspace.active(eager):
        assert workspace.temporary_after((4,), np.float32).array is not None
    assert workspace.temporary_after((4,), np.float32).array.base is None  # outside planning


@pytest.mark.parametrize("act", ["hard_swish", "silu"])
def test_a_fused_activations_scratch_costs_a_conv_no_arena(act):
    # A strided 3x3 convolution (im2col: columns several times its output) with a fused
    # hard-swish or SiLU: the activation's scratch shares the columns' bytes, so the
    # plan's arena is the one a ReLU needs; outputs match the float64 reference.
    rng = np.random.default_rng(4)
    w = (rng.normal(size=(16, 8, 3, 3)) * 0.3).astype(np.float32)
    bias = rng.normal(size=16).astype(np.float32)
    arenas, outs = {}, {}
    x = rng.normal(size=(1, 8, 32, 32)).astype(np.float32)
    for name in ("relu", act):
        b = ModelBuilder()
        y = b.op(
            OpCode.CONV2D,
            [b.input("x", x.shape), b.constant("w", w), b.constant("b", bias)],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
            activation=name,
        )
        b.output(y, name="y")
        interp = Interpreter(model=b.build(), num_threads=1)
        arenas[name] = interp._plan.arena_bytes
        outs[name] = interp.run({"x": x})["y"]
    assert arenas[act] == arenas["relu"]
    (plain,) = run_op(
        OpCode.CONV2D,
        [x.astype(np.float64), w.astype(np.float64), bias.astype(np.float64)],
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    forms = {
        "silu": lambda v: v / (1 + np.exp(-v)),
        "hard_swish": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    }
    want = forms[act](plain)
    # float32 GEMM over 72 products, then a few roundings of the activation.
    np.testing.assert_allclose(outs[act], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(outs["relu"], np.maximum(plain, 0), rtol=1e-4, atol=1e-4)


def test_a_workspace_is_active_only_in_the_thread_that_binds():
    """Plans built side by side in two threads (clients training at once) must not take
    each other's temporaries: the other thread gets a fresh array, not the arena's bytes."""
    arena = _Arena(1 << 16)
    ws = workspace.Workspace(arena.take)
    from_other_thread: list[np.ndarray] = []
    with workspace.active(ws):
        mine = workspace.temporary((8, 8), np.float32)
        other = threading.Thread(
            target=lambda: from_other_thread.append(workspace.temporary((8, 8), np.float32))
        )
        other.start()
        other.join()
    (theirs,) = from_other_thread
    assert np.shares_memory(mine, arena.chunks[0])
    assert not np.shares_memory(theirs, arena.chunks[0]) and theirs.base is None
    assert len(ws.release()) == 1


def test_interpreters_planned_in_parallel_threads_match_one_planned_alone():
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 12, 12))
    w = b.constant("w", rng.standard_normal((32, 3, 3, 3)).astype(np.float32))
    y = b.op(OpCode.CONV2D, [x, w], pads=[1, 1, 1, 1])
    y = b.op(
        OpCode.CONV2D,
        [y, b.constant("wd", rng.standard_normal((32, 1, 3, 3)).astype(np.float32))],
        group=32,
    )
    b.output(y, name="y")
    blob = serialize(b.build())
    feed = {"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    expected = Interpreter(blob).run(feed)["y"]
    results: list[np.ndarray] = []
    barrier = threading.Barrier(4)

    def plan_and_run() -> None:
        barrier.wait()
        interpreters = [Interpreter(blob) for _ in range(5)]
        results.extend(interpreter.run(feed)["y"].copy() for interpreter in interpreters)

    threads = [threading.Thread(target=plan_and_run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_arena_splits_merges_and_grows_in_place():
    arena = _Arena(1 << 20)
    big = arena.take(64 * 100)
    arena.give(big)
    small1, small2 = arena.take(64 * 40), arena.take(64 * 50)  # both inside the freed span
    assert arena.total == 64 * 100
    arena.give(small1)
    arena.give(small2)
    again = arena.take(64 * 100)  # the pieces merged back into one span
    assert arena.total == 64 * 100
    arena.give(again)
    larger = arena.take(64 * 101)  # the free span at the top grows instead of a new block
    assert arena.total == 64 * 101 and len(arena.chunks) == 1
    beyond = arena.take(2 << 20)  # past the reservation: a chunk of its own
    assert len(arena.chunks) == 2 and arena.total == 64 * 101 + (2 << 20)
    assert not np.shares_memory(larger, beyond)


def _fc_model():
    b = ModelBuilder()
    x = b.input("x", (2, 16))
    w = RNG.normal(size=(8, 16)).astype(np.float32)
    bias = RNG.normal(size=8).astype(np.float32)
    y = b.op(OpCode.FULLY_CONNECTED, [x, b.constant("w", w), b.constant("b", bias)])
    b.output(y, name="y")
    return b.build(), w, bias


def _mmap_of(array: np.ndarray) -> mmap.mmap | None:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def test_weights_are_views_of_the_mapped_file(tmp_path):
    model, w, bias = _fc_model()
    path = save(model, tmp_path / "fc.spore")
    interp = Interpreter(model_path=path)
    for name in ("w", "b"):
        index = interp.model.tensor_index(name)
        data = interp.model.tensors[index].data
        assert _mmap_of(data) is not None, f"{name} is not a view of the mapped file"
        # The plan runs on the file's bytes, not on a packed copy.
        assert np.shares_memory(interp._plan.arrays[index], data)
        assert not data.flags.writeable
    x = RNG.normal(size=(2, 16)).astype(np.float32)
    np.testing.assert_allclose(interp.run({"x": x})["y"], x @ w.T + bias, rtol=1e-5)


def test_weights_are_views_of_given_bytes():
    model, w, _ = _fc_model()
    content = serialize(model)
    interp = Interpreter(model_content=content)
    data = interp.model.tensors[interp.model.tensor_index("w")].data
    assert np.shares_memory(data, np.frombuffer(content, np.uint8))
    np.testing.assert_array_equal(data, w)


def test_truncated_file_is_still_a_clear_error(tmp_path):
    model, _, _ = _fc_model()
    data = serialize(model)
    path = tmp_path / "cut.spore"
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(ModelFormatError, match=r"outside the|truncated|past the end"):
        Interpreter(model_path=path)


def test_file_with_empty_and_scalar_constants_reads_back():
    b = ModelBuilder()
    x = b.input("x", (3,))
    empty = b.constant("empty", np.zeros((0, 3), np.float32))
    scalar = b.constant("scalar", np.float32(2.5))
    ints = b.constant("ints", np.arange(5, dtype=np.int64))
    y = b.op(OpCode.MUL, [x, scalar])
    b.output(y, name="y")
    model = b.build()
    back = parse(serialize(model))
    for index in (empty, scalar, ints):
        want, got = model.tensors[index].data, back.tensors[index].data
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert serialize(back) == serialize(model)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_weight_only_dequantize_in_float32_is_exact(dtype):
    info = np.iinfo(dtype)
    q = RNG.integers(info.min, info.max + 1, size=(6, 5, 3)).astype(dtype)
    scale = RNG.uniform(1e-4, 0.5, size=6).astype(np.float32)
    zp = RNG.integers(info.min, info.max + 1, size=6)
    quant = Quantization(scale=scale, zero_point=zp, axis=0)
    got = dequantize_array(q, quant)
    want = (q.astype(np.int64) - zp[:, None, None]) * scale.astype(np.float64)[:, None, None]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("with_bias", [True, False])
def test_im2col_in_bands_matches_the_whole_matrix(monkeypatch, with_bias):
    from sporenet.lite.kernels import im2col

    # Bands of a few output rows (the last one shorter), as a large plane would get.
    monkeypatch.setattr(im2col, "_BLOCK_BYTES", 5 * 9 * 3 * 13 * 4)
    w = RNG.normal(size=(6, 5, 3, 3)).astype(np.float32)
    bias = RNG.normal(size=6).astype(np.float32)
    b = ModelBuilder()
    x = b.input("x", (1, 5, 11, 13))
    inputs = [x, b.constant("w", w)] + ([b.constant("b", bias)] if with_bias else [])
    b.output(b.op(OpCode.CONV2D, inputs, pads=[1, 1, 1, 1]), name="y")
    interp = Interpreter(model=b.build())
    assert interp._plan.kernels[0].strategy == "im2col"
    for seed in range(2):
        v = np.random.default_rng(seed).normal(size=(1, 5, 11, 13)).astype(np.float32)
        want = _conv_reference(v, w, bias if with_bias else None)
        np.testing.assert_allclose(interp.run({"x": v})["y"], want, rtol=1e-4, atol=1e-5)


def _resident_kib(start: int, stop: int) -> tuple[int, int]:
    """(Rss, AnonHugePages) in KiB of the mappings overlapping [start, stop), from
    /proc/self/smaps (an madvise may have split one allocation into several)."""
    rss = huge = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo < stop and start < hi
            elif inside and head == "Rss:":
                rss += int(line.split()[1])
            elif inside and head == "AnonHugePages:":
                huge += int(line.split()[1])
    return rss, huge


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's smaps")
def test_the_arena_holds_the_pages_it_hands_out_and_no_huge_page_more():
    # 2.5 MiB handed out of a 32 MiB reservation: huge pages would make it 4 MiB.
    arena = _Arena(32 << 20)
    span = arena.take(5 << 19)
    arena.prefault()
    region = arena.chunks[0]
    rss, huge = _resident_kib(region.ctypes.data, region.ctypes.data + region.nbytes)
    assert huge == 0
    assert span.nbytes // 1024 <= rss <= span.nbytes // 1024 + 64


def test_released_pages_of_the_writable_arena_keep_their_data():
    # pages.release drops the pages of read-only file mappings only: dropped arena pages
    # would read back as zeros.
    from sporenet.lite import pages

    arena = _Arena(1 << 20)
    values = arena.take(1 << 18).view(np.float32)
    values[...] = 3.0
    assert not pages.release(values)
    assert np.all(values == 3.0)


def test_a_small_layers_columns_are_no_larger_than_its_output(monkeypatch):
    from sporenet.lite.kernels import im2col

    # A 1x3 convolution over 24 channels writes 24x70x32 floats (210 KiB) from columns three
    # times that size: built whole they would be the plan's largest buffer by far.
    monkeypatch.setattr(im2col, "_MIN_BLOCK_BYTES", 64 << 10)
    w = RNG.normal(size=(24, 24, 1, 3)).astype(np.float32)
    bias = RNG.normal(size=24).astype(np.float32)
    b = ModelBuilder()
    x = b.input("x", (1, 24, 70, 32))
    b.output(
        b.op(OpCode.CONV2D, [x, b.constant("w", w), b.constant("b", bias)], pads=[0, 1, 0, 1]),
        name="y",
    )
    interp = Interpreter(model=b.build())
    assert interp._plan.kernels[0].strategy == "im2col"
    tensor = 24 * 70 * 32 * 4
    # Input, output and one output's worth of columns (plus alignment), not 3x the input.
    assert interp._plan.arena_bytes <= 3 * tensor + 64 * 8
    v = RNG.normal(size=(1, 24, 70, 32)).astype(np.float32)
    want = _conv_reference(np.pad(v, ((0, 0), (0, 0), (0, 0), (1, 1))), w, bias, pad=0)
    np.testing.assert_allclose(interp.run({"x": v})["y"], want, rtol=1e-4, atol=1e-5)


def test_parsed_quantization_is_shared_views_of_the_file():
    """A model's many small quantization vectors are read-only views of the file, one per
    distinct value, and the parsed tables hold no per-instance dict."""
    b = ModelBuilder()
    x = b.quantize(b.input("x", (1, 8), np.int8), 0.05, -3, dtype=np.int8)
    for k in range(6):
        w = b.constant(f"w{k}", RNG.integers(-127, 128, (8, 8)).astype(np.int8))
        b.quantize(w, np.full(8, 0.01, np.float32), 0, axis=0, dtype=np.int8)
        x = b.quantize(b.op(OpCode.FULLY_CONNECTED, [x, w]), 0.05 * (k + 2), -3, dtype=np.int8)
    b.output(x, name="y")
    content = serialize(b.build())
    model = parse(content)
    quantized = [t.quantization for t in model.tensors if t.quantization is not None]
    assert len(quantized) == 13
    whole = np.frombuffer(content, np.uint8)
    for q in quantized:
        for array in (q.scale, q.zero_point):
            assert np.shares_memory(array, whole) and not array.flags.writeable
    # One array for the activations' zero point, one for all the weights' (8 zeros).
    assert len({id(q.zero_point) for q in quantized}) == 2
    assert len({id(q.scale) for q in quantized}) == 8  # 7 activation scales, 1 for weights
    assert not hasattr(model.tensors[0], "__dict__")
    assert not hasattr(quantized[0], "__dict__")
    assert not hasattr(model.graphs[0].nodes[0], "__dict__")


def test_a_planned_nodes_specs_and_attributes_hold_no_instance_dict():
    """Every planned node keeps its kernel's Attrs and TensorSpecs: slotted, they cost a
    few pointers each."""
    model, _, _ = _fc_model()
    kernel = next(k for k in Interpreter(model=model)._plan.kernels if k is not None)
    assert not hasattr(kernel.attrs, "__dict__")
    assert all(not hasattr(s, "__dict__") for s in [*kernel.inputs, *kernel.output_specs] if s)
