"""The per-step profiler: every step of the plan timed once per repeat, named by its op."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import save
from sporenet.lite.ops import OpCode
from sporenet.lite.profiling import by_op, main, profile, report
from sporenet.lite.threads import BLAS


def _model():
    rng = np.random.default_rng(0)
    b = ModelBuilder(description="profiled")
    x = b.input("x", (1, 8, 6, 6))
    w = b.constant("dw", rng.normal(size=(8, 1, 3, 3)).astype(np.float32))
    y = b.op(OpCode.CONV2D, [x, w], group=8, pads=[1, 1, 1, 1])
    y = b.op(OpCode.ADD, [y, x])
    b.output(b.op(OpCode.RELU, [y]), name="y")
    return b.build()


def test_every_step_is_timed_and_named_by_its_op():
    interpreter = Interpreter(model=_model(), num_threads=1)
    interpreter.run({"x": np.ones((1, 8, 6, 6), np.float32)})
    times = profile(interpreter, repeats=3)
    steps = interpreter._plan.steps
    assert [t.position for t in times] == list(range(len(steps)))
    assert [t.op for t in times] == [k.op.name for k in interpreter._plan.step_kernels]
    assert {"CONV2D", "ADD"} <= {t.op for t in times}
    conv = next(t for t in times if t.op == "CONV2D")
    assert "depthwise" in conv.kernel and "k3x3 s1x1" in conv.shapes
    assert all(t.seconds >= 0 for t in times)
    totals = by_op(times)
    assert sum(count for _, count, _ in totals) == len(times)
    assert sum(s for _, _, s in totals) == pytest.approx(sum(t.seconds for t in times))
    assert "CONV2D (Conv2D depthwise)" in report(times)


@pytest.mark.skipif(BLAS.get() is None, reason="no BLAS whose thread count can be read")
def test_steps_run_with_the_blas_pool_bounded_as_invoke_bounds_it():
    # An unbounded pool's threads spin on a busy machine, and the caller's CPU clock
    # counts the spinning: the profile would not time what invoke() runs.
    interpreter = Interpreter(model=_model(), num_threads=1)
    interpreter.run({"x": np.ones((1, 8, 6, 6), np.float32)})
    outside = BLAS.get()
    seen: list[int | None] = []

    def clock() -> float:
        seen.append(BLAS.get())
        return 0.0

    BLAS.set(2)
    try:
        if BLAS.get() != 2:
            pytest.skip("this BLAS runs one thread at most")
        profile(interpreter, repeats=1, clock=clock)
        assert BLAS.get() == 2
    finally:
        BLAS.set(outside)
    assert seen and set(seen) == {1}


def test_profiling_leaves_the_results_unchanged():
    interpreter = Interpreter(model=_model(), num_threads=1)
    x = np.random.default_rng(1).normal(size=(1, 8, 6, 6)).astype(np.float32)
    before = interpreter.run({"x": x})["y"]
    profile(interpreter, repeats=2)
    np.testing.assert_array_equal(interpreter.get_tensor(interpreter._output_names["y"]), before)


def test_command_line_prints_the_table(tmp_path, capsys):
    path = tmp_path / "m.spore"
    save(_model(), path)
    assert main([str(path), "--repeats", "2"]) == 0
    assert "by op:" in capsys.readouterr().out
