"""Graph optimization passes over the IR, run in a fixed order by `optimize`.

Each pass is a plain function `pass(model) -> int` that rewrites the model in place and
returns how many rewrites it made (0: nothing to do). `optimize` runs them guarded
(guard.py): a pass whose result the runtime would reject is undone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sporenet.converter.passes.activation_fusion import fuse_activations
from sporenet.converter.passes.affine_chains import fold_affine_chains
from sporenet.converter.passes.batchnorm_folding import fold_batch_norms
from sporenet.converter.passes.bias_folding import fold_biases
from sporenet.converter.passes.bias_forwarding import forward_depthwise_biases
from sporenet.converter.passes.constant_folding import fold_constants
from sporenet.converter.passes.dead_code import eliminate_dead_nodes
from sporenet.converter.passes.dead_taps import prune_dead_taps
from sporenet.converter.passes.gelu import fuse_gelu
from sporenet.converter.passes.guard import GuardedRun, run_guarded
from sporenet.converter.passes.hard_swish import fuse_hard_swish
from sporenet.converter.passes.identity_removal import remove_identities
from sporenet.converter.passes.integer_adds import fold_integer_adds
from sporenet.converter.passes.layer_norm import fuse_layer_norms
from sporenet.converter.passes.mixconv import merge_mixconv
from sporenet.converter.passes.noop_layout import remove_noop_layout
from sporenet.converter.passes.pad_fusion import fuse_pads
from sporenet.converter.passes.row_scatters import scatter_rows
from sporenet.converter.passes.shape_inference import infer_shapes
from sporenet.converter.passes.silu import fuse_silu
from sporenet.converter.passes.subgraph_constants import inline_branch_constants
from sporenet.converter.passes.transpose_sinking import sink_transposes
from sporenet.lite.graph import Model


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Model], int]


PIPELINE: tuple[Pass, ...] = (
    Pass("identity-removal", remove_identities),
    Pass("branch-constant-inlining", inline_branch_constants),
    Pass("constant-folding", fold_constants),
    # issue 27: tf2onnx's NHWC islands between NCHW convolutions cancel out.
    Pass("transpose-sinking", sink_transposes),
    Pass("noop-reshape-transpose-removal", remove_noop_layout),
    # tflitespeed (issue 26): Keras's ZeroPadding2D folded into the convolution after it.
    Pass("pad-fusion", fuse_pads),
    Pass("integer-add-folding", fold_integer_adds),
    Pass("affine-chain-recognition", fold_affine_chains),
    Pass("batchnorm-folding", fold_batch_norms),
    Pass("bias-folding", fold_biases),
    Pass("dead-tap-pruning", prune_dead_taps),  # onv (issue 27): dilated short convolutions
    Pass("hard-swish-recognition", fuse_hard_swish),
    Pass("silu-recognition", fuse_silu),
    Pass("gelu-recognition", fuse_gelu),
    Pass("layer-norm-recognition", fuse_layer_norms),
    Pass("activation-fusion", fuse_activations),
    Pass("mixconv-merging", merge_mixconv),
    # tfdw (issue 26): after activation fusion, which decides which depthwise layers
    # have no activation of their own.
    Pass("depthwise-bias-forwarding", forward_depthwise_biases),
    Pass("row-scatters", scatter_rows),  # onk (issue 27): graph networks' message sums
    Pass("dead-node-elimination", eliminate_dead_nodes),
    Pass("shape-inference", infer_shapes),
)


def optimize(model: Model, first: Sequence[Pass] = ()) -> GuardedRun:
    """Run the passes `first`, then every pass of PIPELINE once, in order, undoing any
    whose result the runtime would reject; returns the rewrites per pass name and the
    passes undone."""
    return run_guarded(model, [(p.name, p.run) for p in (*first, *PIPELINE)])


__all__ = [
    "PIPELINE",
    "GuardedRun",
    "Pass",
    "eliminate_dead_nodes",
    "fold_affine_chains",
    "fold_batch_norms",
    "fold_biases",
    "fold_constants",
    "fold_integer_adds",
    "forward_depthwise_biases",
    "fuse_activations",
    "fuse_gelu",
    "fuse_hard_swish",
    "fuse_pads",
    "fuse_silu",
    "infer_shapes",
    "optimize",
    "remove_identities",
    "remove_noop_layout",
    "sink_transposes",
]
