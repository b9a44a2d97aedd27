"""Flatten, Dropout and Rescale: layers that move, drop or rescale values."""

from __future__ import annotations

import numpy as np

from sporenet.cloud._checks import number
from sporenet.cloud.init import generator
from sporenet.cloud.module import Module
from sporenet.cloud.tape import Var
from sporenet.lite.ops import OpCode


class Flatten(Module):
    """(N, ...) -> (N, prod(...)) (ONNX Flatten with axis=1)."""

    def forward(self, x: Var) -> Var:
        return x.flatten(1)


class Dropout(Module):
    """Zeroes each element with probability `p` while training (scaling the rest by
    1 / (1 - p)); the identity in eval mode, and absent from exported models."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = number("p", p, low=0.0, high=1.0, high_open=True)
        self.seed = int(generator().integers(0, 2**31 - 1))

    def forward(self, x: Var) -> Var:
        if self.p == 0.0:
            return x
        if not self.training:
            if not x.tape.keep_dropout:
                return x
            # The inference form, which lite's make_training_model switches to training.
            return x.tape.op(OpCode.DROPOUT, [x], ratio=self.p, training=0, seed=self.seed)
        # A traced graph seeds the kernel's generator once and it advances every step; an
        # eager tape is new each step, so the step number goes into the seed.
        seed = (self.seed + 7919 * x.tape.step) % (2**31 - 1)
        y, _mask = x.tape.op(
            OpCode.DROPOUT, [x], num_outputs=2, ratio=self.p, training=1, seed=seed
        )
        return y

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Rescale(Module):
    """y = x * scale + offset with fixed constants: input preprocessing that travels inside
    the model (and so inside the exported file), e.g. Rescale(1 / 16) for 0..16 pixels."""

    def __init__(self, scale: float, offset: float = 0.0) -> None:
        super().__init__()
        self.scale = number("scale", scale)
        self.offset = number("offset", offset)

    def forward(self, x: Var) -> Var:
        t = x.tape
        y = t.op(OpCode.MUL, [x, t.constant("rescale.scale", np.float32(self.scale))])
        if self.offset != 0.0:
            y = t.op(OpCode.ADD, [y, t.constant("rescale.offset", np.float32(self.offset))])
        return y

    def extra_repr(self) -> str:
        return f"scale={self.scale}, offset={self.offset}"
