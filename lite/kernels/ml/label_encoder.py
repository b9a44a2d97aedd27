"""LABEL_ENCODER: map each element through a table of keys and values (ai.onnx.ml
LabelEncoder and CategoryMapper): strings, integers or floats on either side, the default
for a key not in the table, NaN keys matching NaN."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.dtypes import STRING
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode


class LabelEncoder(Kernel):
    """inputs: x, keys [K], values [K], default (one value of the values' dtype)."""

    op = OpCode.LABEL_ENCODER
    num_inputs = (4, 4)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        keys = self.constant(1, "keys").ravel()
        values = self.constant(2, "values").ravel()
        default = self.constant(3, "default").ravel()
        if keys.size != values.size:
            raise self.fail(f"keys ({keys.size}) and values ({values.size}) must pair up")
        if default.size != 1 or default.dtype != values.dtype:
            raise self.fail(f"default must be one {values.dtype} value, got {default.dtype}")
        if (x.dtype == STRING) != (keys.dtype == STRING):
            raise self.fail(f"x ({x.dtype}) and keys ({keys.dtype}) must both be text or not")
        if x.dtype != STRING and x.dtype.kind not in "iuf":
            raise self.fail(f"x must be text or numeric, got {x.dtype}")
        self.default = default[0]
        if x.dtype == STRING:
            self.table = dict(zip(keys.tolist(), values.tolist(), strict=True))
        else:
            # Sorted keys searched with NumPy; NaN keys (which never compare equal) apart.
            nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(keys.size, bool)
            order = np.argsort(keys[~nan], kind="stable")
            self.keys = keys[~nan][order]
            self.values = values[~nan][order]
            self.nan_value = values[nan][0] if nan.any() else self.default
        self.output_specs = [TensorSpec(x.shape, values.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        default = self.default
        if self.input(0).dtype == STRING:
            table = self.table

            def lookup() -> None:
                out.flat[:] = [table.get(v, default) for v in x.flat]

            return lookup
        keys, values, nan_value = self.keys, self.values, self.nan_value
        if keys.size == 0:
            return lambda: out.fill(default)

        def search() -> None:
            flat = np.asarray(x).ravel()
            at = np.minimum(np.searchsorted(keys, flat), keys.size - 1)
            found = keys[at] == flat
            result = np.where(found, values[at], default)
            if flat.dtype.kind == "f":
                result = np.where(np.isnan(flat), nan_value, result)
            out[...] = result.reshape(out.shape)

        return search
