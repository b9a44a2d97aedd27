"""The floor NumPy sets under a corpus model's latency: its dense products alone in float32
BLAS, against onnxruntime's whole model, one thread.

A dynamically quantized model (int8 weights, uint8 activations) runs its products in
onnxruntime's integer kernels (VNNI where the CPU has it), reading a quarter of the
bytes; NumPy has no integer BLAS, so the engine runs them as float32 GEMMs. This script
converts the model, records the shape of every FullyConnected product and every
recurrent step's product (kernels/recurrent_fast.bind_product) as the interpreter binds
them, and times each alone on random float32 operands of those shapes (the faster of
x @ W.T read in place and x @ (W.T packed)). Their sum is a lower bound of the engine's
time with the graph's other ops and an LSTM's input projections free; the floor ratio is
that bound over onnxruntime's warm latency. Over 2.5x, no kernel work in NumPy meets the
issue-27 latency target on that model.

    python benchmarks/product_floor.py t5-span-enc vf-embedder tashkeel-rawi ...
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable

import _corpus
import numpy as np
from _packaged_models import make_feeds

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter
from sporenet.lite.kernels import linear, recurrent_fast

Shape = tuple[tuple[int, ...], tuple[int, ...]]


def _median_seconds(step: Callable[[], object], repeats: int) -> float:
    step()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        step()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def _counted(seen: collections.Counter, key: tuple, step: Callable[[], None]) -> Callable[[], None]:
    def counted() -> None:
        seen[key] += 1
        step()

    return counted


def recorded_products(model: bytes, feeds: dict[str, np.ndarray]) -> collections.Counter:
    """("fc", (rows, in), (out, in)) and ("step", x shape, w shape) -> how many of each
    one call of the model runs (a recurrent product runs once per time step)."""
    seen: collections.Counter = collections.Counter()
    fc_bind, step_product = linear.FullyConnected.bind, recurrent_fast.bind_product

    def bind(self, inputs, outputs):  # type: ignore[no-untyped-def]
        x, w = inputs[0], inputs[1]
        key = ("fc", (int(np.prod(x.shape[:-1])), x.shape[-1]), tuple(w.shape))
        return _counted(seen, key, fc_bind(self, inputs, outputs))

    def product(x: np.ndarray, w: np.ndarray, out: np.ndarray):  # type: ignore[no-untyped-def]
        return _counted(seen, ("step", tuple(x.shape), tuple(w.shape)), step_product(x, w, out))

    linear.FullyConnected.bind = bind  # type: ignore[method-assign]
    recurrent_fast.bind_product = product
    try:
        interpreter = Interpreter(model_content=model, num_threads=1)
        interpreter.run(feeds)  # plans (and may fold steps at plan time)
    finally:
        linear.FullyConnected.bind = fc_bind  # type: ignore[method-assign]
        recurrent_fast.bind_product = step_product
    seen.clear()
    interpreter.run(feeds)
    return seen


def product_seconds(kind: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> float:
    """Median time of one float32 product of these shapes, the faster way."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    if kind == "step":
        out = np.empty((*x_shape[:-1], w_shape[-1]), np.float32)
        return _median_seconds(recurrent_fast.bind_product(x, w, out), 50)
    out = np.empty((x_shape[0], w_shape[0]), np.float32)
    packed = np.ascontiguousarray(w.T)
    return min(
        _median_seconds(lambda: np.dot(x, w.T, out=out), 30),
        _median_seconds(lambda: np.dot(x, packed, out=out), 30),
    )


def onnxruntime_seconds(path: str, feeds: dict[str, np.ndarray]) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return _median_seconds(lambda: session.run(None, feeds), 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="corpus model names (_corpus.py)")
    args = parser.parse_args()
    print(f"{'model':18s} {'products':>8s} {'floor ms':>9s} {'ort ms':>8s} {'floor x':>7s}")
    for name in args.names:
        case = next(c for c in _corpus.CORPUS if c.name == name)
        path = _corpus.model_path(case)
        if path is None:
            print(f"{name}: not fetched (benchmarks/fetch_corpus.py)")
            continue
        feeds = make_feeds(case.feeds)
        seen = recorded_products(convert_onnx(str(path)), feeds)
        floor = sum(n * product_seconds(*key) for key, n in seen.items())
        ort_s = onnxruntime_seconds(str(path), feeds)
        count = sum(seen.values())
        print(f"{name:18s} {count:8d} {floor * 1e3:9.3f} {ort_s * 1e3:8.3f} {floor / ort_s:7.2f}")


if __name__ == "__main__":
    main()
