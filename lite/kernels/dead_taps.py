"""Dead taps: the kernel taps of a convolution that only ever read its zero padding.

A dilated convolution over a short input (a temporal convolution network with dilations
1, 2, 4, ... 64 over 25 steps) reads, at its outer taps, positions that lie in the padding
for every output: those taps add exact zeros. Cutting the leading and trailing dead taps
of each spatial axis, with the padding shrunk by the same span, keeps every output: the
live taps meet the same inputs at the same outputs. The converter applies it where the
input size is static (converter/passes/dead_taps.py); a kernel knows the size when it is
prepared and can apply it to any input size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def live_taps(size: int, taps: int, stride: int, dilation: int, begin: int, end: int) -> range:
    """The taps of one spatial axis from the first that reads an input position (not
    padding) for some output to the last that does; empty when none does."""
    outputs = (size + begin + end - dilation * (taps - 1) - 1) // stride + 1
    if outputs < 1:
        return range(0)
    first_position = np.arange(outputs) * stride - begin  # tap 0's position per output
    live = []
    for k in range(taps):
        position = first_position + k * dilation
        if ((position >= 0) & (position < size)).any():
            live.append(k)
    return range(live[0], live[-1] + 1) if live else range(0)


def trim_window(
    in_hw: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> tuple[tuple[range, range], list[int]] | None:
    """For a 2-D window (pads [top, left, bottom, right]): the taps to keep per axis and
    the pads that go with them, or None when no tap is dead. An axis keeps all its taps
    when none is live (the output is the bias alone) or when cutting would need negative
    padding (a crop)."""
    new_pads = [int(p) for p in pads]
    kept: list[range] = []
    for axis in range(2):
        taps = int(kernel[axis])
        keep = live_taps(
            int(in_hw[axis]),
            taps,
            int(strides[axis]),
            int(dilations[axis]),
            new_pads[axis],
            new_pads[axis + 2],
        )
        begin = new_pads[axis] - keep.start * int(dilations[axis]) if keep else -1
        end = new_pads[axis + 2] - (taps - keep.stop) * int(dilations[axis]) if keep else -1
        if not keep or begin < 0 or end < 0:
            keep = range(taps)
        else:
            new_pads[axis], new_pads[axis + 2] = begin, end
        kept.append(keep)
    if all(len(k) == int(kernel[a]) for a, k in enumerate(kept)):
        return None
    return (kept[0], kept[1]), new_pads
