"""Which 4-D tensors a plan stores channels-last (NHWC memory behind an NCHW view).

A layout is chosen per tensor from what its producer and its readers say of it
(Kernel.channels_last_output / channels_last_input / channels_last_follows), so that fewer
steps convert between layouts; the planner then allocates each chosen tensor's buffer in
that order (planner._typed).
"""

from __future__ import annotations

from collections.abc import Collection

from sporenet.lite.graph import Node
from sporenet.lite.kernels.base import ChannelsLast, Kernel


def tensor_readers(
    nodes: list[Node], kernels: list[Kernel | None]
) -> dict[int, list[tuple[Kernel, int]]]:
    """Each tensor's readers: (kernel, input index) in node order."""
    readers: dict[int, list[tuple[Kernel, int]]] = {}
    for node, kernel in zip(nodes, kernels, strict=True):
        if kernel is not None:
            for k, i in enumerate(node.inputs):
                if i != -1:
                    readers.setdefault(i, []).append((kernel, k))
    return readers


def channels_last_tensors(
    nodes: list[Node], kernels: list[Kernel | None], outputs: Collection[int]
) -> set[int]:
    """The 4-D tensors stored channels-last: their producer and every reader accept it and
    one of them prefers it (see ChannelsLast), or the producer computes elementwise from
    an input stored so (Kernel.channels_last_follows), so fewer steps convert between
    layouts. Graph outputs stay contiguous NCHW."""
    readers = tensor_readers(nodes, kernels)
    chosen: set[int] = set()
    for node, kernel in zip(nodes, kernels, strict=True):
        if kernel is None or kernel.is_view:
            continue
        for k, i in enumerate(node.outputs):
            if i in outputs or i not in readers:
                continue
            stances = [kernel.channels_last_output(k)]
            stances += [reader.channels_last_input(index) for reader, index in readers[i]]
            if min(stances) < ChannelsLast.ACCEPTED:
                continue
            follows = _followed_input(node, kernel, k, chosen)
            if max(stances) == ChannelsLast.PREFERRED or (
                follows is not None
                and node.inputs[follows] in chosen
                and (
                    kernel.elementwise
                    or len(readers[i]) > 1  # the others would read it in mixed layouts
                    or not readers[i][0][0].leans_nchw(readers[i][0][1])
                )
            ):
                chosen.add(i)
    _back_through_followers(nodes, kernels, readers, outputs, chosen)
    _matched_operands(nodes, kernels, readers, outputs, chosen)
    return chosen


def _matched_operands(
    nodes: list[Node],
    kernels: list[Kernel | None],
    readers: dict[int, list[tuple[Kernel, int]]],
    outputs: Collection[int],
    chosen: set[int],
) -> None:
    """Store channels-last, too, an NCHW operand of an elementwise step whose other
    full-size operand is stored channels-last, when its producer and every reader accept
    it: a residual add of a block's input (the stem's output, which nothing prefers
    either way) and its channels-last branch otherwise runs one transposing pass over
    mixed layouts, several times slower than a pass in one order."""
    producers = {
        i: (kernel, k)
        for node, kernel in zip(nodes, kernels, strict=True)
        if kernel is not None and not kernel.is_view
        for k, i in enumerate(node.outputs)
    }

    def accepts(i: int) -> bool:
        if i in chosen or i in outputs or i not in producers or i not in readers:
            return False
        producer, k = producers[i]
        stances = [producer.channels_last_output(k)]
        stances += [reader.channels_last_input(index) for reader, index in readers[i]]
        return min(stances) >= ChannelsLast.ACCEPTED

    for node, kernel in zip(nodes, kernels, strict=True):
        if kernel is None or not kernel.elementwise or not kernel.output_specs:
            continue
        shape = kernel.output_specs[0].shape
        full = [
            i
            for k, i in enumerate(node.inputs)
            if i != -1 and len(shape) == 4 and kernel.input(k).shape == shape
        ]
        if any(i in chosen for i in full):
            chosen.update(i for i in full if accepts(i))


def _back_through_followers(
    nodes: list[Node],
    kernels: list[Kernel | None],
    readers: dict[int, list[tuple[Kernel, int]]],
    outputs: Collection[int],
    chosen: set[int],
) -> None:
    """Store channels-last, too, a tensor that is stored NCHW only because nothing ahead
    prefers it, when its producer accepts writing it so and its every reader is a kernel
    whose channels-last output follows it (a PReLU after the first convolution, whose
    output a depthwise layer prefers channels-last): the readers then run in one layout
    instead of converting as they compute. Producers are visited last to first, so a
    chain of such readers is followed back to its start. Narrow tensors (fewer than
    _BACK_MIN_CHANNELS channels) stay as they are: a convolution writing so few channels
    per row multiplies against a skinny operand, slower than the readers gain."""
    first_output = {id(k): n.outputs[0] for n, k in zip(nodes, kernels, strict=True) if n.outputs}

    def follows_into_chosen(reader: Kernel, index: int) -> bool:
        return (
            reader.channels_last_input(index) >= ChannelsLast.ACCEPTED
            and not reader.leans_nchw(index)
            and reader.channels_last_follows(0) == index
            and first_output.get(id(reader)) in chosen
        )

    for node, kernel in zip(reversed(nodes), reversed(kernels), strict=True):
        if kernel is None or kernel.is_view:
            continue
        for k, i in enumerate(node.outputs):
            if i in chosen or i in outputs or i not in readers:
                continue
            spec = kernel.output_specs[k] if k < len(kernel.output_specs) else None
            if spec is None or len(spec.shape) != 4 or spec.shape[1] < _BACK_MIN_CHANNELS:
                continue
            if kernel.channels_last_output(k) < ChannelsLast.ACCEPTED:
                continue
            if all(follows_into_chosen(r, index) for r, index in readers[i]):
                chosen.add(i)


_BACK_MIN_CHANNELS = 32
"""Fewest channels of a tensor stored channels-last for its readers' sake alone (see
_back_through_followers)."""


def _followed_input(node: Node, kernel: Kernel, k: int, chosen: set[int]) -> int | None:
    """The input whose layout output `k` follows (Kernel.channels_last_follows). An
    elementwise kernel whose own choice is stored NCHW follows another input of the
    output's shape stored channels-last: it reads mixed layouts either way, and its output
    then stays channels-last downstream (a residual Add of an NCHW and a channels-last
    tensor starts a channels-last chain instead of converting at every later Add)."""
    follows = kernel.channels_last_follows(k)
    if follows is None or not kernel.elementwise or node.inputs[follows] in chosen:
        return follows
    shape = kernel.output_specs[k].shape
    for j, i in enumerate(node.inputs):
        spec = kernel.inputs[j] if j < len(kernel.inputs) else None
        if i in chosen and spec is not None and spec.shape == shape:
            return j
    return follows
