"""The end-to-end demo: build a model, save it as a .spore file, load it with the runtime, run it.

Run with `python -m sporenet.demo [--out DIR]`. Later stages (training on digits, conversion,
on-device fine-tuning, a federated round) join as they land.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np

from sporenet import lite
from sporenet.lite import Interpreter, ModelBuilder, OpCode


def build_mlp(seed: int = 0) -> lite.Model:
    """A 64-128-64-10 MLP with random weights and a softmax head."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(description="demo MLP 64-128-64-10")
    x = b.input("x", (-1, 64))
    sizes = [64, 128, 64, 10]
    for k, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        w = b.constant(f"fc{k}.weight", rng.normal(0, fan_in**-0.5, (fan_out, fan_in)),
                       trainable=True)
        bias = b.constant(f"fc{k}.bias", np.zeros(fan_out, np.float32), trainable=True)
        x = b.op(OpCode.FULLY_CONNECTED, [x, w, bias],
                 activation="relu" if k < len(sizes) - 2 else "none", name=f"fc{k}")
    b.output(x, "logits")
    b.metadata["labels"] = ",".join(str(d) for d in range(10))
    return b.build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="folder for the model file")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="sporenet-demo-"))
    out.mkdir(parents=True, exist_ok=True)

    model = build_mlp()
    path = lite.save(model, out / "mlp.spore")
    print(f"[1/2] built and saved {path} ({path.stat().st_size} bytes, "
          f"{model.parameter_count()} parameters)")

    interpreter = Interpreter(model_path=path, num_threads=1)
    x = np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32)
    logits = interpreter.run({"x": x})["logits"]
    start = time.perf_counter()
    for _ in range(200):
        interpreter.run({"x": x})
    per_call = (time.perf_counter() - start) / 200
    print(f"[2/2] ran the model with the lite runtime: logits {logits.shape}, "
          f"predictions {logits.argmax(1).tolist()}, {per_call * 1e6:.0f} us per batch of 8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
