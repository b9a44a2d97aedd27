"""Classic-ML benchmark: scikit-learn forests exported by skl2onnx, converted and run by the
lite Interpreter against onnxruntime (one thread each), at batch 1, 100 and 1000.

    python benchmarks/classic_ml.py [--trees 300] [--runs 20] [--json results.json]

Forests: a random forest classifier (deep trees, 3 classes) and a gradient-boosting
regressor (shallow trees), `--trees` trees each, fitted on a fixed synthetic data set with
20 features. Each line gives the median latency of both engines, measured alternately on
the same input, and their ratio; the outputs are checked to agree first (labels equal,
scores within 1e-5). Tree kernels run no BLAS, so the BLAS environment does not matter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from sporenet.converter import convert_onnx
from sporenet.lite import Interpreter

BATCHES = (1, 100, 1000)


def forests(trees: int) -> list[tuple[str, Any, np.ndarray]]:
    """(name, fitted estimator, data) of each benchmarked forest."""
    from sklearn.datasets import make_classification, make_regression
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier

    xc, yc = make_classification(2000, 20, n_informative=10, n_classes=3, random_state=0)
    xr, yr = make_regression(2000, 20, noise=1.0, random_state=0)
    xc, xr = xc.astype(np.float32), xr.astype(np.float32)
    rf = RandomForestClassifier(trees, max_depth=12, random_state=0, n_jobs=1).fit(xc, yc)
    gb = GradientBoostingRegressor(n_estimators=trees, max_depth=4, random_state=0).fit(xr, yr)
    return [
        (f"RandomForestClassifier({trees} trees, depth<=12)", rf, xc),
        (f"GradientBoostingRegressor({trees} trees, depth 4)", gb, xr),
    ]


def median_ms(fn: Any, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench(name: str, estimator: Any, x: np.ndarray, runs: int) -> list[dict[str, Any]]:
    from skl2onnx import to_onnx

    options = {id(estimator): {"zipmap": False}} if hasattr(estimator, "predict_proba") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(estimator, x[:1], options=options, target_opset={"": 21, "ai.onnx.ml": 3})
    started = time.perf_counter()
    interpreter = Interpreter(model_content=convert_onnx(onx), num_threads=1)
    load_s = time.perf_counter() - started
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    session = ort.InferenceSession(onx.SerializeToString(), so)
    input_name = session.get_inputs()[0].name
    rows = []
    for batch in BATCHES:
        feed = {input_name: x[:batch]}
        ours, theirs = interpreter.run(feed), session.run(None, feed)
        for out, ref in zip(session.get_outputs(), theirs, strict=True):
            got = ours[out.name]
            if ref.dtype.kind in "iO":
                assert got.tolist() == ref.tolist(), (name, out.name)
            else:
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)
        lite_ms, ort_ms = 0.0, 0.0
        for _ in range(2):  # alternate the engines against drift on a shared machine
            lite_ms += median_ms(lambda f=feed: interpreter.run(f), runs) / 2
            ort_ms += median_ms(lambda f=feed: session.run(None, f), runs) / 2
        rows.append(
            {
                "model": name,
                "batch": batch,
                "lite_ms": round(lite_ms, 3),
                "onnxruntime_ms": round(ort_ms, 3),
                "ratio": round(lite_ms / ort_ms, 2),
                "load_s": round(load_s, 2),
            }
        )
        print(
            f"{name:48s} batch {batch:5d}: lite {lite_ms:9.3f} ms   onnxruntime "
            f"{ort_ms:9.3f} ms   ratio {lite_ms / ort_ms:6.2f}x",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, default=300, help="trees per forest")
    parser.add_argument("--runs", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = []
    for name, estimator, x in forests(args.trees):
        rows += bench(name, estimator, x, args.runs)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
