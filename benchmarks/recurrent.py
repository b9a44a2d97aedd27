"""Recurrent layers: sporenet's LSTM / GRU / RNN kernels against onnxruntime, one thread each.

    python benchmarks/recurrent.py [--runs 30] [--model path/to/model_with_lstm.onnx:WIDTH]

Each case is an ONNX model with one recurrent node, built with onnx.helper, converted once
(its sequence length stays dynamic) and run by both engines alternately on the same input;
the medians and their ratio are printed. `--model` adds a real model (e.g. ddddocr's
common.onnx, a CNN + bidirectional LSTM captcha reader) run at the given input width.

The timing runs in a child process whose environment has OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE removed (OpenBLAS then picks its kernels for this CPU); the child prints
which BLAS library and kernel ran (threadpoolctl) and its peak RSS.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _common import cpu_description

CASES = [  # kind, direction, seq, batch, input, hidden
    ("LSTM", "forward", 32, 1, 64, 128),
    ("LSTM", "bidirectional", 32, 8, 64, 128),
    ("LSTM", "bidirectional", 100, 1, 256, 256),
    ("GRU", "bidirectional", 32, 8, 64, 128),
    ("RNN", "forward", 32, 8, 64, 128),
]
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _child(runs: int, model_arg: str | None) -> int:
    import resource
    import statistics
    import time

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from threadpoolctl import threadpool_info

    from sporenet.converter import convert_onnx
    from sporenet.lite import Interpreter

    def session(model: onnx.ModelProto) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only (some exporters declare wrong shapes)
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def compare(
        label: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options: object
    ) -> None:
        ours = Interpreter(model_content=convert_onnx(model, **options), num_threads=1)
        theirs = session(model)
        got, want = ours.run(feeds), theirs.run(None, feeds)
        name = model.graph.output[0].name
        error = float(np.max(np.abs(got[name] - want[0])) / max(np.max(np.abs(want[0])), 1e-9))
        a, b, ca, cb = [], [], [], []
        for _ in range(runs):
            c, t = time.thread_time(), time.perf_counter()
            ours.run(feeds)
            a.append(time.perf_counter() - t)
            ca.append(time.thread_time() - c)
            c, t = time.thread_time(), time.perf_counter()
            theirs.run(None, feeds)
            b.append(time.perf_counter() - t)
            cb.append(time.thread_time() - c)
        ma, mb = statistics.median(a), statistics.median(b)
        cpu = statistics.median(ca) / statistics.median(cb)
        print(
            f"{label:<44} {ma * 1e3:9.3f} {mb * 1e3:9.3f} {ma / mb:7.2f}x {cpu:6.2f}x  {error:.1e}"
        )

    # "cpu": the ratio of median CPU times of the calling thread (both engines run one
    # thread inline), which other processes' time slices on a busy machine do not inflate.
    print(f"{'case':<44} {'sporenet':>9} {'ort':>9} {'ratio':>8} {'cpu':>7}  max rel. diff")
    print(f"{'':<44} {'ms':>9} {'ms':>9}")
    rng = np.random.default_rng(0)
    for kind, direction, seq, batch, size, hidden in CASES:
        dirs = 2 if direction == "bidirectional" else 1
        g = GATES[kind]
        inits = [
            numpy_helper.from_array((rng.normal(size=s) * 0.1).astype(np.float32), n)
            for n, s in (
                ("W", (dirs, g * hidden, size)),
                ("R", (dirs, g * hidden, hidden)),
                ("B", (dirs, 2 * g * hidden)),
            )
        ]
        outputs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
        node = helper.make_node(
            kind, ["X", "W", "R", "B"], outputs, hidden_size=hidden, direction=direction
        )
        shapes = {
            "Y": ["seq", dirs, "batch", hidden],
            "Y_h": [dirs, "batch", hidden],
            "Y_c": [dirs, "batch", hidden],
        }
        graph = helper.make_graph(
            [node],
            "rnn",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", "batch", size])],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs],
            initializer=inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 8
        x = rng.normal(size=(seq, batch, size)).astype(np.float32)
        compare(f"{kind} {direction} seq {seq} batch {batch} {size}->{hidden}", model, {"X": x})
    if model_arg:
        path, _, width = model_arg.rpartition(":")
        model = onnx.load(path)
        dims = [d.dim_value or int(width) for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = rng.uniform(0, 1, dims).astype(np.float32)
        name = model.graph.input[0].name
        # Converted at this width: the model's reshapes depend on it (dynamic shapes).
        compare(
            f"{os.path.basename(path)} input {dims}", model, {name: x}, input_shapes={name: dims}
        )
    blas = [
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    print(f"CPU: {cpu_description()}")
    print(f"BLAS: {'; '.join(blas) or 'unknown'}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--model", help="PATH:WIDTH of an ONNX model with recurrent layers")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.runs, args.model)
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, __file__, "--child", "--runs", str(args.runs)]
    if args.model:
        command += ["--model", args.model]
    return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
