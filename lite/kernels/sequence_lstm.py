"""SEQUENCE_LSTM: TFLite's float LSTM over a sequence, with every variant its kernels
run: coupled input and forget gates (CIFG), peepholes, layer normalization, a projection
layer, cell and projection clipping.

Per step, for each gate g of (input, forget, cell, output), in float32 as TFLite:
  a_g = W_g x + R_g h (+ P_g * c for the input and forget gates' peepholes)
  layer norm: a_g = (a_g - mean) / sqrt(var + 1e-8) * L_g + b_g   (over the cells)
  else:       a_g = a_g + b_g
  i = sigmoid(a_i), or 1 - f with CIFG;  f = sigmoid(a_f);  g = act(a_c)
  c = clip(f * c + i * g, cell_clip)
  o = sigmoid(a_o), its peephole P_o * c on the new c (before the layer norm)
  h = o * act(c);  with a projection: h = clip(W_p h + b_p, proj_clip)
The ONNX-semantics LSTM (recurrent.py) runs the plain variants faster; the TFLite
importer emits this op for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode

X = 0
W, R, P, B = 1, 5, 9, 12  # first of the four input / recurrent weights, peepholes, biases
PROJ_W, PROJ_B, H, C = 16, 17, 18, 19
LN = 20  # first of the four layer-norm weights
GATES = ("input", "forget", "cell", "output")
F32 = np.dtype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.float32(1) / (np.float32(1) + np.exp(-x))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda v: np.maximum(v, np.float32(0)),
    "relu6": lambda v: np.clip(v, np.float32(0), np.float32(6)),
    "sigmoid": _sigmoid,
    "none": lambda v: v,
}


class SequenceLSTM(Kernel):
    op = OpCode.SEQUENCE_LSTM
    num_inputs = (20, 24)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(X)
        if x.dtype != F32 or x.rank != 3:
            raise self.fail(f"input must be float32 of rank 3, got {x.dtype}{list(x.shape)}")
        self.time_major = bool(attrs.int("time_major", 0))
        self.reverse = bool(attrs.int("reverse", 0))  # from the last step (a backward LSTM)
        time, batch = x.shape[:2] if self.time_major else x.shape[1::-1]
        name = str(attrs.values.get("activation", "tanh"))
        if name not in ACTIVATIONS:
            raise self.fail(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
        self.activation = ACTIVATIONS[name]
        self.cell_clip = attrs.float("cell_clip", 0.0)
        self.proj_clip = attrs.float("proj_clip", 0.0)
        self.cifg = self.optional_input(W) is None
        cells, n_in = self._shape(W + 1, 2, "input-to-forget weights")
        projection = self.optional_input(PROJ_W)
        n_out = projection.shape[0] if projection is not None else cells
        if projection is not None and projection.shape != (n_out, cells):
            raise self.fail(
                f"projection weights must be [n, {cells}], got {list(projection.shape)}"
            )
        self.present = [g for g in range(4) if not (self.cifg and g == 0)]
        for g in self.present:
            self._expect(W + g, (cells, n_in), f"input-to-{GATES[g]} weights")
            self._expect(R + g, (cells, n_out), f"recurrent-to-{GATES[g]} weights")
            self._expect(B + g, (cells,), f"{GATES[g]} gate bias")
        self.peephole = self.optional_input(P + 1) is not None
        if self.peephole:
            for k in (0, 1, 2) if not self.cifg else (1, 2):
                self._expect(P + k, (cells,), "peephole weights")
        self.layer_norm = len(inputs) > LN + 1 and self.optional_input(LN + 1) is not None
        if self.layer_norm:
            for g in self.present:
                self._expect(LN + g, (cells,), f"{GATES[g]} layer-norm weights")
        if self.optional_input(PROJ_B) is not None:
            self._expect(PROJ_B, (n_out,), "projection bias")
        self._expect(H, (batch, n_out), "output state")
        self._expect(C, (batch, cells), "cell state")
        y = (time, batch, n_out) if self.time_major else (batch, time, n_out)
        self.output_specs = [TensorSpec(y, F32), TensorSpec((batch, n_out), F32)]
        self.output_specs.append(TensorSpec((batch, cells), F32))

    def _shape(self, index: int, rank: int, what: str) -> tuple[int, ...]:
        spec = self.input(index)
        if spec.dtype != F32 or spec.rank != rank:
            raise self.fail(
                f"{what} must be float32 of rank {rank}, got {spec.dtype}{list(spec.shape)}"
            )
        return spec.shape

    def _expect(self, index: int, shape: tuple[int, ...], what: str) -> None:
        spec = self.optional_input(index)
        if spec is None:
            raise self.fail(f"{what} (input {index}) is missing")
        if spec.dtype != F32 or spec.shape != shape:
            raise self.fail(
                f"{what} must be float32{list(shape)}, got {spec.dtype}{list(spec.shape)}"
            )

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, y, h_out, c_out = required(inputs, X), outputs[0], outputs[1], outputs[2]
        present, act = self.present, self.activation

        def at(k: int) -> np.ndarray | None:
            return inputs[k] if k < len(inputs) else None

        def compute() -> None:
            xs = x if self.time_major else x.transpose(1, 0, 2)
            ys = y if self.time_major else y.transpose(1, 0, 2)
            h, c = required(inputs, H).copy(), required(inputs, C).copy()
            # every step's input contributions at once: one GEMM per gate
            xw = {g: xs @ required(inputs, W + g).T for g in present}
            steps = range(xs.shape[0])
            for t in reversed(steps) if self.reverse else steps:
                pre = {g: xw[g][t] + h @ required(inputs, R + g).T for g in present}
                if self.peephole:
                    for g, k in ((0, 0), (1, 1)):
                        if g in pre:
                            pre[g] += required(inputs, P + k) * c
                forget = _sigmoid(self._finish(pre, 1, inputs))
                gate = act(self._finish(pre, 2, inputs))
                keep = (
                    np.float32(1) - forget if self.cifg else _sigmoid(self._finish(pre, 0, inputs))
                )
                c = forget * c + keep * gate
                if self.cell_clip > 0:
                    c = np.clip(c, -self.cell_clip, self.cell_clip)
                if self.peephole:
                    pre[3] += required(inputs, P + 2) * c
                h = _sigmoid(self._finish(pre, 3, inputs)) * act(c)
                weights = at(PROJ_W)
                if weights is not None:
                    h = h @ weights.T
                    bias = at(PROJ_B)
                    if bias is not None:
                        h = h + bias
                    if self.proj_clip > 0:
                        h = np.clip(h, -self.proj_clip, self.proj_clip)
                h = h.astype(F32, copy=False)
                c = c.astype(F32, copy=False)
                ys[t] = h
            np.copyto(h_out, h)
            np.copyto(c_out, c)

        return compute

    def _finish(
        self, pre: dict[int, np.ndarray], g: int, inputs: list[np.ndarray | None]
    ) -> np.ndarray:
        """Gate g's pre-activation with its layer norm (if any) and bias."""
        a = pre[g]
        if self.layer_norm:
            mean = a.mean(axis=-1, keepdims=True)
            var = np.square(a - mean).mean(axis=-1, keepdims=True)
            a = (a - mean) / np.sqrt(var + np.float32(1e-8)) * required(inputs, LN + g)
        return a + required(inputs, B + g)
