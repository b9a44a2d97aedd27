"""ai.onnx.ml linear models and support vector machines: LinearClassifier ->
LINEAR_CLASSIFIER, LinearRegressor -> FULLY_CONNECTED, SVMClassifier and SVMRegressor ->
SVM."""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import ml_common as mc
from sporenet.lite.ops import OpCode


def linear_classifier(ctx: ImportContext, node: OnnxNode) -> list[int]:
    labels = mc.class_labels(node)
    x = mc.as_matrix(ctx, node.input(0))
    coefficients = np.asarray(node.attrs.get("coefficients", []), np.float32)
    intercepts = np.asarray(node.attrs.get("intercepts", []), np.float32)
    features = ctx.shape(x)[-1]
    if features < 1 or coefficients.size % features:
        raise node.fail(f"coefficients ({coefficients.size}) are not whole rows of {features}")
    index, scores = ctx.emit(
        OpCode.LINEAR_CLASSIFIER,
        [
            x,
            ctx.constant(f"{node.name}/coefficients", coefficients.reshape(-1, features)),
            ctx.constant(f"{node.name}/intercepts", intercepts),
        ],
        num_outputs=2,
        post_transform=node.attr("post_transform", "NONE"),
        n_labels=int(labels.size),
    )
    return [mc.label_output(ctx, node, index, labels), scores]


def linear_regressor(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """y = X coefficients^T + intercepts, [N, targets] float32; PROBIT is not supported."""
    transform = node.attr("post_transform", "NONE")
    if transform != "NONE":
        raise node.fail(f"post_transform {transform!r} is not supported (only NONE)")
    x = mc.as_float32(ctx, mc.as_matrix(ctx, node.input(0)))
    targets = int(node.attr("targets", 1))
    coefficients = np.asarray(node.attrs.get("coefficients", []), np.float32)
    intercepts = np.asarray(node.attrs.get("intercepts", []) or [0.0] * targets, np.float32)
    features = ctx.shape(x)[-1]
    if coefficients.size != targets * features or intercepts.size != targets:
        raise node.fail(
            f"coefficients must hold {targets} x {features} values and intercepts {targets}"
        )
    weight = ctx.constant(f"{node.name}/coefficients", coefficients.reshape(targets, features))
    bias = ctx.constant(f"{node.name}/intercepts", intercepts)
    return [ctx.emit1(OpCode.FULLY_CONNECTED, [x, weight, bias])]


def _svm_inputs(ctx: ImportContext, node: OnnxNode) -> tuple[list[int], dict]:
    x = mc.as_matrix(ctx, node.input(0))
    features = ctx.shape(x)[-1]
    sv = np.asarray(node.attrs.get("support_vectors", []), np.float32)
    if sv.size % max(features, 1):
        raise node.fail(f"support_vectors ({sv.size}) are not whole rows of {features}")
    name = node.name
    params = node.attrs.get("kernel_params", [])
    attrs = {
        "kernel": node.attr("kernel_type", "LINEAR"),
        "gamma": float(params[0]) if len(params) > 0 else 0.0,
        "coef0": float(params[1]) if len(params) > 1 else 0.0,
        "degree": float(params[2]) if len(params) > 2 else 0.0,
        "post_transform": node.attr("post_transform", "NONE"),
    }
    inputs = [
        x,
        ctx.constant(f"{name}/support_vectors", sv.reshape(-1, features)),
        ctx.constant(
            f"{name}/coefficients", np.asarray(node.attrs.get("coefficients", []), np.float32)
        ),
        ctx.constant(f"{name}/rho", np.asarray(node.attrs.get("rho", []), np.float32)),
    ]
    return inputs, attrs


def svm_regressor(ctx: ImportContext, node: OnnxNode) -> list[int]:
    inputs, attrs = _svm_inputs(ctx, node)
    return ctx.emit(OpCode.SVM, inputs, one_class=int(node.attr("one_class", 0)), **attrs)


def svm_classifier(ctx: ImportContext, node: OnnxNode) -> list[int]:
    labels = mc.class_labels(node)
    inputs, attrs = _svm_inputs(ctx, node)
    name = node.name
    inputs += [
        ctx.constant(f"{name}/prob_a", np.asarray(node.attrs.get("prob_a", []), np.float32)),
        ctx.constant(f"{name}/prob_b", np.asarray(node.attrs.get("prob_b", []), np.float32)),
        ctx.constant(
            f"{name}/vectors_per_class",
            np.asarray(node.attrs.get("vectors_per_class", []), np.int64),
        ),
    ]
    index, scores = ctx.emit(
        OpCode.SVM, inputs, num_outputs=2, classifier=1, n_labels=int(labels.size), **attrs
    )
    return [mc.label_output(ctx, node, index, labels), scores]
