"""Conv2D gradients (groups, depthwise, stride, dilation, padding) vs finite differences
and PyTorch."""

from __future__ import annotations

import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import check_op, rand


def torch_conv(x, w, b=None, *, stride=1, dilation=1, padding=(0, 0, 0, 0), groups=1):
    import torch.nn.functional as F

    top, left, bottom, right = padding
    x = F.pad(x, (left, right, top, bottom))
    return F.conv2d(x, w, b, stride=stride, dilation=dilation, groups=groups)


CASES = {
    # name: (x shape, w shape, attrs)
    "plain": ((2, 3, 6, 6), (4, 3, 3, 3), {}),
    # Enough input channels for the filter gradient's channels-last columns.
    "wide_channels": ((2, 8, 5, 5), (3, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    "pointwise": ((2, 3, 5, 5), (4, 3, 1, 1), {}),
    # Padding wider than the kernel reach: the input gradient takes the scatter path.
    "pointwise_padded": ((1, 2, 4, 4), (3, 2, 1, 1), {"pads": [1, 1, 1, 1]}),
    "stride2_pad1": ((2, 2, 7, 7), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asymmetric_pads": ((1, 2, 5, 6), (2, 2, 3, 2), {"pads": [0, 1, 2, 1]}),
    "dilation2": ((1, 2, 7, 7), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "groups2": ((2, 4, 5, 5), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": (
        (2, 3, 6, 6),
        (3, 1, 3, 3),
        {"group": 3, "pads": [1, 1, 1, 1], "strides": [2, 2]},
    ),
    "depthwise_multiplier2": ((1, 2, 5, 5), (4, 1, 3, 3), {"group": 2}),
    # One input channel (a first layer), strided with asymmetric padding.
    "single_input_channel": ((2, 1, 6, 6), (4, 1, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 0]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conv2d(name):
    xs, ws, attrs = CASES[name]
    group = attrs.get("group", 1)
    kwargs = {
        "stride": attrs.get("strides", [1, 1])[0],
        "dilation": attrs.get("dilations", [1, 1])[0],
        "padding": attrs.get("pads", [0, 0, 0, 0]),
        "groups": group,
    }
    check_op(
        lambda b, x, w, bias: b.op(OpCode.CONV2D, [x, w, bias], **attrs),
        {"x": rand(*xs, seed=1)},
        {"w": rand(*ws, seed=2, scale=0.5), "bias": rand(ws[0], seed=3)},
        torch_fn=lambda x, w, bias: torch_conv(x, w, bias, **kwargs),
        max_elements=24,
    )


def test_conv2d_same_upper_with_fused_relu():
    # auto_pad resolved by the backward ops exactly as by the forward; relu through y.
    check_op(
        lambda b, x, w: b.op(
            OpCode.CONV2D, [x, w], auto_pad="SAME_UPPER", strides=[2, 2], activation="relu"
        ),
        {"x": rand(1, 2, 6, 6, seed=4)},
        {"w": rand(3, 2, 3, 3, seed=5)},
        max_elements=24,
    )
