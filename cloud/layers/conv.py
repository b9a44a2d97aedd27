"""Conv2d and DepthwiseConv2d (CONV2D, NCHW, weights (out, in/groups, kh, kw), ONNX attrs)."""

from __future__ import annotations

from typing import Any

from sporenet.cloud._checks import pair, positive_int
from sporenet.cloud.errors import ConfigError
from sporenet.cloud.init import bias_uniform, he_uniform
from sporenet.cloud.module import Module, Parameter
from sporenet.cloud.tape import Var
from sporenet.lite.ops import OpCode


def conv_pads(
    padding: Any, kernel: tuple[int, int], dilation: tuple[int, int], stride: tuple[int, int]
) -> tuple[list[int], str]:
    """`padding` (int, pair, "valid" or "same") as ONNX pads [top, left, bottom, right] and
    auto_pad."""
    if padding == "valid":
        return [0, 0, 0, 0], "NOTSET"
    if padding == "same":
        totals = [(k - 1) * d for k, d in zip(kernel, dilation, strict=True)]
        if stride == (1, 1) and all(t % 2 == 0 for t in totals):
            h, w = totals[0] // 2, totals[1] // 2
            return [h, w, h, w], "NOTSET"
        # Uneven or strided "same": the runtime works the split out from the input size.
        return [0, 0, 0, 0], "SAME_UPPER"
    if isinstance(padding, str):
        raise ConfigError(f"`padding` must be an int, a pair, 'same' or 'valid', got {padding!r}")
    ph, pw = pair("padding", padding, minimum=0)
    return [ph, pw, ph, pw], "NOTSET"


class Conv2d(Module):
    """2-D convolution over NCHW input."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        *,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.in_channels = positive_int("in_channels", in_channels)
        self.out_channels = positive_int("out_channels", out_channels)
        self.kernel_size = pair("kernel_size", kernel_size)
        self.stride = pair("stride", stride)
        self.dilation = pair("dilation", dilation)
        self.groups = positive_int("groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ConfigError(
                f"`groups` ({groups}) must divide in_channels ({in_channels}) and "
                f"out_channels ({out_channels})"
            )
        self.padding = padding
        self.pads, self.auto_pad = conv_pads(padding, self.kernel_size, self.dilation, self.stride)
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = Parameter(he_uniform(shape, fan_in))
        self.bias = Parameter(bias_uniform((out_channels,), fan_in)) if bias else None

    def attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "strides": list(self.stride),
            "dilations": list(self.dilation),
            "pads": list(self.pads),
            "group": self.groups,
        }
        if self.auto_pad != "NOTSET":
            attrs["auto_pad"] = self.auto_pad
        return attrs

    def forward(self, x: Var) -> Var:
        t = x.tape
        inputs = [x, t.param(self.weight)]
        if self.bias is not None:
            inputs.append(t.param(self.bias))
        return t.op(OpCode.CONV2D, inputs, **self.attrs())

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding!r}, groups={self.groups}"
        )


class DepthwiseConv2d(Conv2d):
    """Depthwise convolution: one filter (or `depth_multiplier` filters) per input channel."""

    def __init__(
        self,
        channels: int,
        kernel_size: Any,
        *,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        depth_multiplier: int = 1,
        bias: bool = True,
    ) -> None:
        channels = positive_int("channels", channels)
        depth_multiplier = positive_int("depth_multiplier", depth_multiplier)
        super().__init__(
            channels,
            channels * depth_multiplier,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=channels,
            bias=bias,
        )
