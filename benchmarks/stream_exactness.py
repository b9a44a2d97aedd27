"""Byte-exactness of the streaming and wake-word models of the TFLite corpus across an
executor change: 300 frames of seeded inputs through one interpreter per model; every
frame's outputs and, after the last, every variable (the streaming states), saved or
compared byte for byte.

    python benchmarks/stream_exactness.py --save F.npz     # before the change
    python benchmarks/stream_exactness.py --check F.npz    # after: exit 1 on a difference

Models: the corpus entries of kind "speech (int8 stream)" and "speech (wake word)"
(fetched by tflite_corpus.py), converted in this process.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from tflite_corpus import MANIFEST, fetch

KINDS = ("speech (int8 stream)", "speech (wake word)")
FRAMES = 300


def frames_of(name: str, frames: int) -> dict[str, np.ndarray]:
    """`name`'s outputs at every frame (stacked) and its variables after the last."""
    from sporenet.converter import convert_tflite
    from sporenet.lite import Interpreter

    entry = next(e for e in MANIFEST if e.name == name)
    data = convert_tflite(str(fetch(entry)), input_shapes=dict(entry.shapes) or None)
    it = Interpreter(model_content=data, num_threads=1)
    rng = np.random.default_rng(0)
    inputs = it.get_input_details()
    outputs = it.get_output_details()
    seen: dict[str, list[np.ndarray]] = {f"out{d['index']}": [] for d in outputs}
    for _ in range(frames):
        for d in inputs:
            dtype, shape = np.dtype(d["dtype"]), tuple(d["shape"])
            if dtype.kind == "f":
                value = rng.uniform(-1, 1, shape).astype(dtype)
            else:
                info = np.iinfo(dtype)
                value = rng.integers(max(info.min, -128), min(info.max, 127) + 1, shape)
            it.set_tensor(d["index"], value.astype(dtype))
        it.invoke()
        for d in outputs:
            seen[f"out{d['index']}"].append(it.get_tensor(d["index"]))
    result = {k: np.stack(v) for k, v in seen.items()}
    result.update((f"var{i}", np.array(a)) for i, a in it.variables.items())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", help="write the figures to this .npz")
    mode.add_argument("--check", help="compare with this .npz")
    parser.add_argument("--only", nargs="*", help="model names")
    args = parser.parse_args()
    names = [e.name for e in MANIFEST if e.kind in KINDS and (not args.only or e.name in args.only)]
    arrays = {}
    for name in names:
        arrays.update((f"{name}/{k}", v) for k, v in frames_of(name, FRAMES).items())
    if args.save:
        np.savez(args.save, **arrays)
        print(f"saved {len(arrays)} arrays of {len(names)} models")
        return 0
    want = dict(np.load(args.check))
    bad = sorted(
        k
        for k in set(want) | set(arrays)
        if k not in want
        or k not in arrays
        or want[k].dtype != arrays[k].dtype
        or want[k].shape != arrays[k].shape
        or want[k].tobytes() != arrays[k].tobytes()
    )
    print(f"{len(arrays)} arrays of {len(names)} models; {len(bad)} differ: {bad[:20]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
