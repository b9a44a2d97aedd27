"""Tracing a module into an IR Model (graph mode and export both start here)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.cloud.errors import TraceError
from sporenet.cloud.module import Module, training_mode
from sporenet.cloud.tape import Tape, Var, batch_shape
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode

INPUT_NAME = "input"
LOGITS_NAME = "logits"


def trace(
    module: Module,
    sample_shape: Sequence[int],
    *,
    training: bool,
    softmax_output: bool = False,
    keep_dropout: bool = False,
) -> Model:
    """The module's forward pass as a Model with input "input" (dynamic batch) and output
    "logits" (plus "probabilities" with `softmax_output`).

    The module's train/eval flags are set to `training` while tracing and then restored.
    Parameter values are copied into the model, so later training does not change it.
    `keep_dropout` keeps inference-mode Dropout nodes (for lite's make_training_model).
    """
    with training_mode(module, training):
        tape = Tape(eager=False, training=training, names=module.state_names())
        tape.keep_dropout = keep_dropout
        x = tape.input(INPUT_NAME, shape=batch_shape(sample_shape), dtype=np.float32)
        out = module(x)
        if not isinstance(out, Var):
            raise TraceError(f"{type(module).__name__}.forward must return a Var, got {type(out)}")
        if out.index == x.index:
            out = tape.op(OpCode.IDENTITY, [out])
        outputs = [(out, LOGITS_NAME)]
        if softmax_output:
            outputs.append(
                (tape.op(OpCode.SOFTMAX, [out], axis=-1, name="probabilities"), "probabilities")
            )
        model = tape.model(outputs)
    # Decouple the model from the live parameter arrays (training updates them in place).
    for t in model.tensors:
        if t.data is not None:
            t.data = t.data.copy()
    return model
