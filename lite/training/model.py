"""make_training_model: add a "train" graph (forward, loss, backward, updates) to a model.

The train graph reuses the infer graph's tensors: the same weights (which the Trainer
binds as variables shared by both plans) and the same activation tensors. Dropout nodes
switch to training mode, BatchNorm to BATCH_NORM_TRAINING (batch statistics, running
averages updated in place) and an LSTM the gradient flows through to LSTM_TRAINING (which
saves its steps, so the backward pass does not run the forward one again). Optimizer
slots (momentum, Adam moments and step counts) are new zero-initialized constant tensors
named after their parameter. The update nodes come last, after every backward node that
reads the old weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

import numpy as np

from sporenet.lite.autodiff import append_gradients
from sporenet.lite.builder import unique_name
from sporenet.lite.errors import InputError
from sporenet.lite.graph import DYNAMIC, Graph, Model, Node, Signature, Tensor
from sporenet.lite.ops import OpCode
from sporenet.lite.opset import DECLARATIONS
from sporenet.lite.opset.decl import FROM_OUTPUT, Activation, DerivedMap, derived_map
from sporenet.lite.training.config import LOSSES, OptimizerConfig
from sporenet.lite.validate import validate

LOSS_OPS = {
    "softmax_cross_entropy": OpCode.SOFTMAX_CROSS_ENTROPY,
    "mse": OpCode.MSE_LOSS,
    "bce_with_logits": OpCode.BCE_WITH_LOGITS,
}


def running_stats(graph: Graph, ops: tuple[OpCode, ...] = (OpCode.BATCH_NORM,)) -> set[int]:
    """Tensors holding BatchNorm running mean and variance (inputs 3 and 4)."""
    return {i for n in graph.nodes if n.op in ops for i in n.inputs[3:5]}


def updated_stats(model: Model) -> set[int]:
    """Running statistics the train graph updates (its BatchNorms in training form)."""
    train = model.graphs[model.signature("train").graph]
    return running_stats(train, (OpCode.BATCH_NORM_TRAINING,))


WEIGHT_INPUTS: Mapping[OpCode, tuple[int, ...]] = derived_map(lambda d: d.weights or None)
"""Input positions that hold weights, per op (`OpDecl.weights`). Other constant inputs are
arguments (shapes, pads, clip bounds, running statistics) that kernels need as load-time
constants."""


def default_trainable(model: Model, graph: Graph) -> set[int]:
    """Tensors flagged trainable, or else every float constant the graph reads as a weight
    (see WEIGHT_INPUTS)."""
    used = {i for n in graph.nodes for i in n.inputs if i != -1}
    flagged = {i for i in used if model.tensors[i].trainable and model.tensors[i].data is not None}
    if flagged:
        return flagged
    weights = {
        n.inputs[k]
        for n in graph.nodes
        for k in WEIGHT_INPUTS.get(n.op, ())
        if k < len(n.inputs) and n.inputs[k] != -1
    }
    return {
        i
        for i in weights
        if model.tensors[i].data is not None and model.tensors[i].dtype.kind == "f"
    }


def trainable_names(model: Model, graph: Graph) -> list[str]:
    """Names of the float constants `graph` reads: what `trainable` may name, sorted."""
    used = {i for n in graph.nodes for i in n.inputs if i != -1}
    return sorted(
        model.tensors[i].name
        for i in used
        if model.tensors[i].data is not None and model.tensors[i].dtype.kind == "f"
    )


UNFUSED_OPS: Mapping[Activation, OpCode] = DerivedMap(
    lambda: {
        d.activation: op
        for op, d in DECLARATIONS.items()
        if d.activation is not None and d.activation not in FROM_OUTPUT
    }
)
"""Fused activations whose derivative needs the pre-activation value, which a fused node
does not keep: the train graph computes them as a separate op after the node (the infer
graph keeps the fused, faster form)."""
ACTIVATION_PARAMS = ("alpha", "beta", "approximate")


def _unfuse(m: Model, n: Node, new_tensor: Callable[..., int]) -> list[Node]:
    """`n` without its fused activation, writing a new tensor, then the activation op."""
    name = n.attrs["activation"]
    out = m.tensors[n.outputs[0]]
    pre = new_tensor(f"{out.name}/pre_activation", out.dtype, out.shape)
    attrs = {k: v for k, v in n.attrs.items() if k != "activation" and k not in ACTIVATION_PARAMS}
    params = {k: v for k, v in n.attrs.items() if k in ACTIVATION_PARAMS}
    return [
        Node(n.op, list(n.inputs), [pre, *n.outputs[1:]], attrs, n.version, n.name),
        Node(UNFUSED_OPS[name], [pre], [n.outputs[0]], params, 1, f"{n.name}/{name}"),
    ]


def make_training_model(
    model: Model,
    *,
    output: str,
    loss: str,
    optimizer: OptimizerConfig,
    label_smoothing: float = 0.0,
    trainable: set[str] | None = None,
    one_hot_labels: bool = False,
) -> Model:
    """A copy of `model` with its "infer" signature and a new "train" signature.

    train inputs: the infer inputs, "labels" (int64 class ids (N,) for cross-entropy, or
    float targets shaped like the output: one-hot rows with one_hot_labels=True, and
    always for "mse" and "bce_with_logits") and "lr" (float32 scalar).
    train outputs: "loss" and "logits" (the chosen output). `trainable` names the tensors
    to train; the others stay frozen (see default_trainable for the default).
    """
    infer = _check_arguments(model, output, loss, optimizer, label_smoothing)
    m = Model(
        tensors=list(model.tensors),
        graphs=copy.deepcopy(model.graphs),
        signatures=dict(model.signatures),
        metadata=dict(model.metadata),
        producer=model.producer,
        producer_version=model.producer_version,
        description=model.description,
    )
    if not model.signatures:
        m.signatures["infer"] = infer
    forward = m.graphs[infer.graph]
    new_tensor = _tensor_maker(m)
    params = _trainable_params(m, forward, trainable)
    nodes = _training_forward(m, forward, set(params), new_tensor)
    nodes = _pool_before_relu(m, nodes, {*forward.outputs, *infer.outputs.values()}, new_tensor)

    # ---- loss
    out = infer.outputs[output]
    out_t = m.tensors[out]
    batch_shape = (DYNAMIC, *out_t.shape[1:]) if out_t.shape else ()
    if loss == "softmax_cross_entropy" and not one_hot_labels:
        labels = new_tensor("labels", np.int64, (DYNAMIC,))
    else:
        labels = new_tensor("labels", out_t.dtype, batch_shape)
    lr = new_tensor("lr", np.float32, ())
    loss_t = new_tensor("loss", out_t.dtype, ())
    loss_outputs = [loss_t]
    attrs: dict = {}
    if loss == "softmax_cross_entropy":
        loss_outputs.append(new_tensor(f"{output}/probabilities", out_t.dtype, batch_shape))
        attrs["label_smoothing"] = float(label_smoothing)
    nodes.append(Node(LOSS_OPS[loss], [out, labels], loss_outputs, attrs, 1, "loss"))
    train = Graph(
        name="train", inputs=[*forward.inputs, labels, lr], outputs=[loss_t, out], nodes=nodes
    )
    m.graphs.append(train)
    gi = len(m.graphs) - 1

    # ---- backward and updates
    grads = append_gradients(m, gi, loss_t, params)
    train.nodes = _relu_into_pool_gradients(train.nodes, set(train.outputs))
    train.nodes = _bias_into_filter_gradients(train.nodes, set(train.outputs))
    train.nodes = _relu_into_routing_masks(train.nodes)
    for p in params:
        train.nodes.append(_update_node(m, p, grads[p], lr, optimizer, new_tensor))

    m.signatures["train"] = Signature(
        key="train",
        graph=gi,
        inputs={**infer.inputs, "labels": labels, "lr": lr},
        outputs={"loss": loss_t, "logits": out},
    )
    m.metadata["train.loss"] = loss
    m.metadata["train.optimizer"] = optimizer.kind
    m.metadata["train.lr"] = repr(float(optimizer.lr))  # Trainer.step's default rate
    validate(m)
    return m


def _check_arguments(
    model: Model, output: str, loss: str, optimizer: OptimizerConfig, label_smoothing: float
) -> Signature:
    """make_training_model's arguments checked; returns the infer signature."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}")
    if not isinstance(optimizer, OptimizerConfig):
        raise TypeError(f"optimizer must be an OptimizerConfig, got {type(optimizer).__name__}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if label_smoothing and loss != "softmax_cross_entropy":
        raise ValueError("label_smoothing applies to loss='softmax_cross_entropy' only")
    if "train" in model.signatures:
        raise ValueError("the model already has a 'train' signature")
    infer = model.signature("infer")
    if output not in infer.outputs:
        raise ValueError(
            f"output {output!r} is not an output of the infer signature; "
            f"outputs are {sorted(infer.outputs)}"
        )
    for name in ("labels", "lr"):
        if name in infer.inputs:
            raise ValueError(f"the infer signature already has an input named {name!r}")
    return infer


def _tensor_maker(m: Model) -> Callable[..., int]:
    """new_tensor(name, dtype, shape, data=None): a tensor appended to m, named uniquely."""
    names = {t.name for t in m.tensors}

    def new_tensor(
        name: str, dtype: Any, shape: tuple[int, ...], data: np.ndarray | None = None
    ) -> int:
        name = unique_name(name, names)
        m.tensors.append(Tensor(name=name, dtype=np.dtype(dtype), shape=shape, data=data))
        return len(m.tensors) - 1

    return new_tensor


def _trainable_params(m: Model, forward: Graph, trainable: set[str] | None) -> list[int]:
    """The tensors to train, sorted, each flagged trainable (the flag travels with the
    file, for on-device fine-tuning)."""
    if trainable is None:
        params = sorted(default_trainable(m, forward))
    else:
        by_name = {t.name: i for i, t in enumerate(m.tensors)}
        unknown = sorted(set(trainable) - set(by_name))
        if unknown:
            raise InputError(
                f"trainable names unknown tensors {unknown}; the model's "
                f"trainable tensors are {trainable_names(m, forward)}"
            )
        params = sorted(by_name[n] for n in trainable)
        bad = [
            m.tensors[i].name
            for i in params
            if m.tensors[i].data is None or m.tensors[i].dtype.kind != "f"
        ]
        if bad:
            raise InputError(
                f"trainable tensors must be float constants (weights): {bad}; "
                f"the model's trainable tensors are {trainable_names(m, forward)}"
            )
    if not params:
        raise ValueError("nothing to train: the model has no float weights")
    for i in params:
        m.tensors[i] = replace(m.tensors[i], trainable=True)
    return params


def _training_forward(
    m: Model, forward: Graph, params: set[int], new_tensor: Callable[..., int]
) -> list[Node]:
    """The forward nodes in training mode: Dropout drawing masks, BatchNorm with batch
    statistics, an LSTM the gradient flows through saving its steps for LSTM_GRAD, max
    pools the gradient flows through emitting their routing mask, and activations whose
    derivative needs their input split off."""
    nodes: list[Node] = []
    trained = set(params)  # tensors that depend on a trained parameter
    for n in forward.nodes:
        if trained.intersection(n.inputs):
            trained.update(n.outputs)
        if n.op == OpCode.LSTM and trained.intersection(n.inputs):
            nodes.append(_lstm_training(m, n, new_tensor))
        elif n.op == OpCode.DROPOUT:
            x = n.inputs[0]
            mask = new_tensor(f"{n.name}/mask", m.tensors[x].dtype, m.tensors[x].shape)
            # The step counter of the random masks: training state, saved in checkpoints.
            step = new_tensor(f"{n.name}/rng_step", np.int64, (), np.zeros((), np.int64))
            attrs = {**n.attrs, "training": 1}
            nodes.append(
                Node(OpCode.DROPOUT, [x, step], [n.outputs[0], mask], attrs, n.version, n.name)
            )
        elif n.op == OpCode.BATCH_NORM and set(n.inputs[1:3]) & params:
            # A BatchNorm whose scale and bias are frozen stays in inference form (frozen
            # statistics too), as transfer learning wants for a frozen backbone.
            x = n.inputs[0]
            c = m.tensors[n.inputs[1]].shape
            stats = [
                new_tensor(f"{n.name}/{s}", m.tensors[x].dtype, c)
                for s in ("batch_mean", "batch_invstd")
            ]
            attrs = {k: v for k, v in n.attrs.items() if k != "training_mode"}
            outputs = [n.outputs[0], *stats]
            nodes.append(
                Node(OpCode.BATCH_NORM_TRAINING, list(n.inputs), outputs, attrs, 1, n.name)
            )
        elif n.op == OpCode.MAX_POOL2D and len(n.outputs) == 1 and trained.intersection(n.inputs):
            nodes.append(_routing_pool(m, n, new_tensor))
        elif n.attrs.get("activation", "none") in UNFUSED_OPS:
            nodes.extend(_unfuse(m, n, new_tensor))
        else:
            nodes.append(
                replace(n, inputs=list(n.inputs), outputs=list(n.outputs), attrs=dict(n.attrs))
            )
    return nodes


def _routing_pool(m: Model, n: Node, new_tensor: Callable[..., int]) -> Node:
    """A MAX_POOL2D node with routing=1: output 1, bool (kh * kw, *y.shape), marks the
    tap of each window's first maximum, which MAX_POOL2D_GRAD then reads (one multiply
    per tap) instead of comparing every tap of x with y again."""
    y = m.tensors[n.outputs[0]]
    kernel = cast(list[int], n.attrs["kernel_shape"])
    taps = int(np.prod(kernel))
    mask = new_tensor(f"{n.name or y.name}/routing", np.bool_, (taps, *y.shape))
    attrs = {**n.attrs, "routing": 1}
    return Node(OpCode.MAX_POOL2D, list(n.inputs), [n.outputs[0], mask], attrs, n.version, n.name)


def _lstm_training(m: Model, n: Node, new_tensor: Callable[..., int]) -> Node:
    """An LSTM node as LSTM_TRAINING: the same inputs, attributes and outputs (Y_c made
    when absent) and the steps it saves for the backward pass (LSTM_GRAD's input 11)."""
    outputs = list(n.outputs) + [-1] * (3 - len(n.outputs))
    for k, o in enumerate(outputs):
        if o == -1:
            outputs[k] = new_tensor(f"{n.name}/output{k}", m.tensors[n.inputs[0]].dtype, ())
    saved = new_tensor(f"{n.name}/saved_steps", m.tensors[n.inputs[0]].dtype, ())
    return Node(OpCode.LSTM_TRAINING, list(n.inputs), [*outputs, saved], dict(n.attrs), 1, n.name)


def _pool_before_relu(
    m: Model, nodes: list[Node], kept: set[int], new_tensor: Callable[..., int]
) -> list[Node]:
    """The nodes with each ReLU that feeds only a MAX_POOL2D moved after the pool: a RELU
    node, or a fused "relu" activation (split off its node, as _unfuse does).

    ReLU is monotone, so max(relu(window)) == relu(max(window)) bit for bit, and the
    gradients are equal too: where the window's maximum is positive both route it to
    the same first maximum, elsewhere both are zero. The ReLU and its derivative then
    run on the pooled tensor (a 2x2 pool: a quarter of the elements)."""
    readers: dict[int, list[int]] = {}
    for k, n in enumerate(nodes):
        for i in n.inputs:
            readers.setdefault(i, []).append(k)
    changed: dict[int, list[Node]] = {}  # position -> the nodes replacing it
    for k, n in enumerate(nodes):
        fused = n.op != OpCode.MAX_POOL2D and n.attrs.get("activation") == Activation.RELU
        if not (n.op == OpCode.RELU or fused) or len(n.outputs) != 1 or n.outputs[0] in kept:
            continue
        users = readers.get(n.outputs[0], [])
        if len(users) != 1 or users[0] in changed:
            continue
        pool = nodes[users[0]]
        if pool.op != OpCode.MAX_POOL2D or pool.attrs.get("activation", "none") != "none":
            continue
        y = m.tensors[pool.outputs[0]]
        pooled = new_tensor(f"{y.name}/before_relu", y.dtype, y.shape)
        if fused:
            out = m.tensors[n.outputs[0]]
            source = new_tensor(f"{out.name}/pre_activation", out.dtype, out.shape)
            attrs = {a: v for a, v in n.attrs.items() if a != "activation"}
            changed[k] = [replace(n, inputs=list(n.inputs), outputs=[source], attrs=attrs)]
            relu = Node(OpCode.RELU, [pooled], [pool.outputs[0]], {}, 1, f"{n.name}/relu")
        else:
            source, changed[k] = n.inputs[0], []
            relu = replace(n, inputs=[pooled], outputs=[pool.outputs[0]], attrs=dict(n.attrs))
        inputs = [source, *pool.inputs[1:]]
        outputs = [pooled, *pool.outputs[1:]]  # and its routing mask, if any
        changed[users[0]] = [
            replace(pool, inputs=inputs, outputs=outputs, attrs=dict(pool.attrs)),
            relu,
        ]
    return [new for k, n in enumerate(nodes) for new in changed.get(k, [n])]


def _relu_into_pool_gradients(nodes: list[Node], kept: set[int]) -> list[Node]:
    """The nodes with each ReLU gradient that feeds only a MAX_POOL2D_GRAD of the ReLU's
    input folded into it (relu=1), the backward half of _pool_before_relu.

    The ReLU's derivative at y is [y > 0]; MAX_POOL2D_GRAD routes only windows whose
    maximum y is positive instead of multiplying g by a mask in a pass of its own."""
    producer = {o: n for n in nodes for o in n.outputs}
    readers: dict[int, int] = {}
    for n in nodes:
        for i in n.inputs:
            readers[i] = readers.get(i, 0) + 1
    dropped: set[int] = set()
    folded: dict[int, Node] = {}
    for k, n in enumerate(nodes):
        if n.op != OpCode.MAX_POOL2D_GRAD or n.attrs.get("relu", 0):
            continue
        grad = producer.get(n.inputs[0])
        if (
            grad is None
            or grad.op != OpCode.ACTIVATION_GRAD
            or grad.attrs.get("activation") != Activation.RELU
            or readers.get(n.inputs[0]) != 1
            or n.inputs[0] in kept
            or not _relu_of(producer, grad, n.inputs[2])
        ):
            continue
        dropped.add(id(grad))
        folded[k] = replace(n, inputs=[grad.inputs[0], *n.inputs[1:]], attrs={**n.attrs, "relu": 1})
    return [folded.get(k, n) for k, n in enumerate(nodes) if id(n) not in dropped]


def _relu_into_routing_masks(nodes: list[Node]) -> list[Node]:
    """The nodes with the ReLU derivative of each MAX_POOL2D_GRAD (relu=1, reading the
    routing mask of the pool whose output y it takes) moved into that mask: the pool
    routes only positive maxima (positive_only=1) and the gradient reads the mask alone
    (relu=0), which skips its pass masking g by y > 0. The mask must have no other
    reader, for the others route every window."""
    readers: dict[int, int] = {}
    for n in nodes:
        for i in n.inputs:
            readers[i] = readers.get(i, 0) + 1
    pools = {
        n.outputs[1]: k
        for k, n in enumerate(nodes)
        if n.op == OpCode.MAX_POOL2D and n.attrs.get("routing", 0) and len(n.outputs) == 2
    }
    changed: dict[int, Node] = {}
    for k, n in enumerate(nodes):
        if n.op != OpCode.MAX_POOL2D_GRAD or not n.attrs.get("relu", 0) or len(n.inputs) < 4:
            continue
        at = pools.get(n.inputs[3])
        if at is None or readers[n.inputs[3]] != 1 or nodes[at].outputs[0] != n.inputs[2]:
            continue
        pool = nodes[at]
        changed[at] = replace(pool, attrs={**pool.attrs, "positive_only": 1})
        changed[k] = replace(n, attrs={**n.attrs, "relu": 0})
    return [changed.get(k, n) for k, n in enumerate(nodes)]


def _bias_into_filter_gradients(nodes: list[Node], kept: set[int]) -> list[Node]:
    """The nodes with each convolution's bias gradient, REDUCE_SUM of g over (N, H, W),
    made the second output of the CONV2D_BACKPROP_FILTER of the same g that comes before
    it: the filter gradient's GEMM then sums g through a row of ones under its columns,
    where the REDUCE_SUM would read all of g once more."""
    filters: dict[int, int] = {}  # g -> position of its (single-output) filter gradient
    fused: dict[int, Node] = {}
    dropped: set[int] = set()
    for k, n in enumerate(nodes):
        if n.op == OpCode.CONV2D_BACKPROP_FILTER and len(n.outputs) == 1:
            filters.setdefault(n.inputs[0], k)
            continue
        if n.op != OpCode.REDUCE_SUM or len(n.inputs) != 1 or n.outputs[0] in kept:
            continue
        g = n.inputs[0]
        at = filters.get(g)
        if at is None or at in fused:  # (g of a filter gradient is 4-D: its kernel checks)
            continue
        axes = cast(list[int], n.attrs.get("axes", []))
        if sorted(a % 4 for a in axes) != [0, 2, 3] or n.attrs.get("keepdims", 1):
            continue
        grad = nodes[at]
        fused[at] = replace(grad, outputs=[*grad.outputs, n.outputs[0]], attrs=dict(grad.attrs))
        dropped.add(k)
    return [fused.get(k, n) for k, n in enumerate(nodes) if k not in dropped]


def _relu_of(producer: Mapping[int, Node], grad: Node, y: int) -> bool:
    """Whether ACTIVATION_GRAD `grad` (a ReLU's) takes the derivative at y: it reads y as
    the ReLU's input, or the output of a RELU node of y."""
    if len(grad.inputs) > 1 and grad.inputs[1] == y:
        return True
    if len(grad.inputs) < 3 or grad.inputs[2] < 0:
        return False
    relu = producer.get(grad.inputs[2])
    return relu is not None and relu.op == OpCode.RELU and relu.inputs[0] == y


def _update_node(
    m: Model, p: int, grad: int, lr: int, opt: OptimizerConfig, new_tensor: Callable[..., int]
) -> Node:
    """The optimizer's update node for parameter `p`, with zero-initialized slots."""
    param = m.tensors[p]

    def slot(kind: str, dtype: object = None, shape: tuple[int, ...] | None = None) -> int:
        shape = param.shape if shape is None else shape
        dtype = param.dtype if dtype is None else dtype
        return new_tensor(f"{param.name}/{kind}", dtype, shape, np.zeros(shape, dtype))

    name = f"update/{param.name}"
    if opt.kind == "sgd":
        inputs = [p, grad, lr]
        if opt.momentum:
            inputs.append(slot("momentum"))
        return Node(
            OpCode.SGD_UPDATE,
            inputs,
            [],
            {
                "momentum": float(opt.momentum),
                "nesterov": int(opt.nesterov),
                "weight_decay": float(opt.weight_decay),
            },
            1,
            name,
        )
    inputs = [p, grad, lr, slot("adam_m"), slot("adam_v"), slot("adam_step", np.int64, ())]
    return Node(
        OpCode.ADAM_UPDATE,
        inputs,
        [],
        {
            "beta1": float(opt.betas[0]),
            "beta2": float(opt.betas[1]),
            "eps": float(opt.eps),
            "weight_decay": float(opt.weight_decay),
            "decoupled": int(opt.kind == "adamw"),
        },
        1,
        name,
    )


def optimizer_slots(model: Model) -> set[int]:
    """Tensors the train graph's update nodes write besides the parameters themselves."""
    sig = model.signature("train")
    slots = set()
    for n in model.graphs[sig.graph].nodes:
        if n.op == OpCode.SGD_UPDATE and len(n.inputs) > 3:
            slots.add(n.inputs[3])
        elif n.op == OpCode.ADAM_UPDATE:
            slots.update(n.inputs[3:6])
    return slots


def parameters(model: Model) -> list[int]:
    """Tensors the train graph updates (input 0 of its update nodes), in graph order."""
    sig = model.signature("train")
    return [
        n.inputs[0]
        for n in model.graphs[sig.graph].nodes
        if n.op in (OpCode.SGD_UPDATE, OpCode.ADAM_UPDATE)
    ]
