"""Pad (ONNX semantics): modes constant, reflect, edge and wrap, and symmetric (reflect
including the edge, TFLite's MIRROR_PAD SYMMETRIC), on tensors of any rank.

Pads come from the `pads` attribute or a constant second input, in ONNX order
[x1_begin, x2_begin, ..., x1_end, x2_end]; negative pads crop. The fill value comes from
a constant third input or the `value` attribute (default 0); a constant fourth input or
the `axes` attribute restricts the pads to some axes.

Every call copies the (cropped) input into the interior of `out` and then fills the
borders axis by axis; the border regions are slices worked out at bind time. The output
buffer is shared with other tensors by the planner, so borders are rewritten every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, ChannelsLast, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode

MODES = ("constant", "reflect", "edge", "wrap", "symmetric")


class Pad(Kernel):
    op = OpCode.PAD
    num_inputs = (1, 4)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        rank = x.rank
        self.mode = attrs.str("mode", "constant")
        if self.mode not in MODES:
            raise self.fail(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.optional_input(1) is not None:
            pads = [int(v) for v in np.ravel(self.constant(1, "pads"))]
        else:
            pads = attrs.ints("pads", None)
            if pads is None:
                raise self.fail("needs a `pads` attribute or a constant pads input")
        if self.optional_input(3) is not None:
            axes = [int(v) for v in np.ravel(self.constant(3, "axes"))]
        else:
            axes = attrs.ints("axes", list(range(rank)))
        if any(not -rank <= a < rank for a in axes) or len(set(a % rank for a in axes)) != len(
            axes
        ):
            raise self.fail(f"axes {axes} must be distinct axes of a rank-{rank} input")
        if len(pads) != 2 * len(axes):
            raise self.fail(
                f"pads must hold 2 values per padded axis ({2 * len(axes)} for input shape "
                f"{list(x.shape)}), got {len(pads)}: {pads}"
            )
        self.begin, self.end = [0] * rank, [0] * rank
        for k, a in enumerate(axes):
            self.begin[a % rank], self.end[a % rank] = pads[k], pads[k + len(axes)]
        if self.optional_input(2) is not None:
            value = np.ravel(self.constant(2, "constant_value"))
            if value.size != 1:
                raise self.fail(f"constant_value must hold one value, got {value.size}")
            self.value = value[0].item()
        else:
            self.value = attrs.float("value", 0.0)
        shape = []
        for a in range(rank):
            size, b, e = x.shape[a], self.begin[a], self.end[a]
            kept = size + min(b, 0) + min(e, 0)
            if kept < 0 or (kept == 0 and (b > 0 or e > 0)):
                raise self.fail(f"pads {pads} crop axis {a} (size {size}) below zero elements")
            if self.mode == "reflect" and max(b, e) > kept - 1 and max(b, e) > 0:
                raise self.fail(
                    f"reflect pads {max(b, e)} on axis {a} must be smaller than its size "
                    f"after cropping ({kept})"
                )
            if self.mode in ("wrap", "symmetric") and max(b, e) > kept:
                raise self.fail(f"wrap pads on axis {a} must not exceed its size ({kept})")
            shape.append(kept + max(b, 0) + max(e, 0))
        self.output_specs = [TensorSpec(tuple(shape), x.dtype)]

    # Layout: the copy and the border fills are views on logical axes, so a 4-D tensor
    # may be stored channels-last on both sides (BlazeFace pads channels between NHWC
    # layers).
    def channels_last_input(self, index: int) -> ChannelsLast:
        four = index == 0 and self.input(0).rank == 4
        return ChannelsLast.ACCEPTED if four else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED if self.input(0).rank == 4 else ChannelsLast.REFUSED

    def channels_last_follows(self, index: int) -> int | None:
        return 0

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        rank = x.ndim
        src = tuple(
            slice(max(-b, 0), x.shape[a] - max(-e, 0))
            for a, (b, e) in enumerate(zip(self.begin, self.end, strict=True))
        )
        dst = tuple(
            slice(max(b, 0), max(b, 0) + (s.stop - s.start))
            for b, s in zip(self.begin, src, strict=True)
        )
        x_in, out_in = x[src], out[dst]
        steps: list[Callable[[], object]] = []
        copyto = np.copyto
        value = np.asarray(self.value, out.dtype)
        for a in range(rank):
            b, e = max(self.begin[a], 0), max(self.end[a], 0)
            if not b and not e:
                continue
            n = dst[a].stop - dst[a].start
            lo = dst[a].start

            # Axes before `a` are already complete, axes after it only in their interior.
            def region(axis_slice: slice, a: int = a) -> tuple[slice, ...]:
                return (*[slice(None)] * a, axis_slice, *dst[a + 1 :])

            for width, at_begin in ((b, True), (e, False)):
                if not width:
                    continue
                target = slice(0, lo) if at_begin else slice(lo + n, lo + n + width)
                tgt = out[region(target)]
                if self.mode == "constant":
                    steps.append(lambda t=tgt: copyto(t, value))
                    continue
                if self.mode == "edge":
                    edge = lo if at_begin else lo + n - 1
                    source = slice(edge, edge + 1)
                elif self.mode == "reflect":
                    # out[lo - 1 - i] = out[lo + 1 + i]; out[hi + i] = out[hi - 2 - i]
                    source = (
                        slice(lo + width, lo, -1)
                        if at_begin
                        else slice(lo + n - 2, lo + n - 2 - width, -1)
                    )
                    if source.stop is not None and source.stop < 0:
                        source = slice(source.start, None, -1)
                elif self.mode == "symmetric":
                    # reflect including the edge: out[lo - 1 - i] = out[lo + i] and
                    # out[hi + i] = out[hi - 1 - i]
                    source = (
                        slice(lo + width - 1, lo - 1 if lo else None, -1)
                        if at_begin
                        else slice(
                            lo + n - 1, lo + n - 1 - width if lo + n - 1 - width >= 0 else None, -1
                        )
                    )
                else:  # wrap: the far end of the interior
                    source = slice(lo + n - width, lo + n) if at_begin else slice(lo, lo + width)
                src_view = out[region(source)]
                steps.append(lambda t=tgt, s=src_view: copyto(t, s))

        def compute() -> None:
            copyto(out_in, x_in)
            for step in steps:
                step()

        return compute
