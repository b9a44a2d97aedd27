"""Cases of the TFLite conformance suite known to fail today, each with its reason
(strict xfails: one that starts passing fails the run until it is removed here).

Regenerate with `python -m tests.conformance.tflite_suite --write-known`, then
`ruff format` it.
"""

KNOWN_FAILURES: dict[str, str] = {
    "abs[4d, int16x8]": ("lite has no int16x8 kernels"),
    "relu[4d, int16x8]": ("lite has no int16x8 kernels"),
    "relu6[4d, int16x8]": ("lite has no int16x8 kernels"),
    "logistic[4d, int16x8]": ("lite has no int16x8 kernels"),
    "tanh[4d, int16x8]": ("lite has no int16x8 kernels"),
    "leaky_relu[4d, int16x8]": ("lite has no int16x8 kernels"),
    "softmax[4d, int16x8]": ("lite has no int16x8 kernels"),
    "add[same shape float32, int16x8]": ("lite has no int16x8 kernels"),
    "add[trailing vector float32, int16x8]": ("lite has no int16x8 kernels"),
    "add[both broadcast float32, int16x8]": ("lite has no int16x8 kernels"),
    "add[scalar float32, int16x8]": ("lite has no int16x8 kernels"),
    "add[constant operand, int16x8]": ("lite has no int16x8 kernels"),
    "add[same shape float32 relu, int16x8]": ("lite has no int16x8 kernels"),
    "add[trailing vector float32 relu, int16x8]": ("lite has no int16x8 kernels"),
    "add[same shape float32 relu6, int16x8]": ("lite has no int16x8 kernels"),
    "add[trailing vector float32 relu6, int16x8]": ("lite has no int16x8 kernels"),
    "sub[same shape float32, int16x8]": ("lite has no int16x8 kernels"),
    "sub[trailing vector float32, int16x8]": ("lite has no int16x8 kernels"),
    "sub[both broadcast float32, int16x8]": ("lite has no int16x8 kernels"),
    "sub[scalar float32, int16x8]": ("lite has no int16x8 kernels"),
    "sub[constant operand, int16x8]": ("lite has no int16x8 kernels"),
    "sub[same shape float32 relu, int16x8]": ("lite has no int16x8 kernels"),
    "sub[trailing vector float32 relu, int16x8]": ("lite has no int16x8 kernels"),
    "sub[same shape float32 relu6, int16x8]": ("lite has no int16x8 kernels"),
    "sub[trailing vector float32 relu6, int16x8]": ("lite has no int16x8 kernels"),
    "mul[same shape float32, int16x8]": ("lite has no int16x8 kernels"),
    "mul[trailing vector float32, int16x8]": ("lite has no int16x8 kernels"),
    "mul[both broadcast float32, int16x8]": ("lite has no int16x8 kernels"),
    "mul[scalar float32, int16x8]": ("lite has no int16x8 kernels"),
    "mul[constant operand, int16x8]": ("lite has no int16x8 kernels"),
    "mul[same shape float32 relu, int16x8]": ("lite has no int16x8 kernels"),
    "mul[trailing vector float32 relu, int16x8]": ("lite has no int16x8 kernels"),
    "mul[same shape float32 relu6, int16x8]": ("lite has no int16x8 kernels"),
    "mul[trailing vector float32 relu6, int16x8]": ("lite has no int16x8 kernels"),
    "conv_2d[stride 1 dilation 1 padding 0 act 0, int16x8]": ("lite has no int16x8 kernels"),
    "conv_2d[stride 2 dilation 1 padding 0 act 1, int16x8]": ("lite has no int16x8 kernels"),
    "conv_2d[stride 1 dilation 2 padding 1 act 3, int16x8]": ("lite has no int16x8 kernels"),
    "conv_2d[stride 2 dilation 1 padding 1 act 0, int16x8]": ("lite has no int16x8 kernels"),
    "depthwise_conv_2d[multiplier 1 stride 1 padding 0, int16x8]": ("lite has no int16x8 kernels"),
    "depthwise_conv_2d[multiplier 2 stride 2 padding 0, int16x8]": ("lite has no int16x8 kernels"),
    "depthwise_conv_2d[multiplier 1 stride 2 padding 1, int16x8]": ("lite has no int16x8 kernels"),
    "fully_connected[keep_num_dims False bias True input [2, 6], int16x8]": (
        "lite has no int16x8 kernels"
    ),
    "fully_connected[keep_num_dims True bias True input [2, 3, 6], int16x8]": (
        "lite has no int16x8 kernels"
    ),
    "fully_connected[keep_num_dims False bias False input [2, 6], int16x8]": (
        "lite has no int16x8 kernels"
    ),
    "average_pool_2d[size 2 stride 2 padding 1, int16x8]": ("lite has no int16x8 kernels"),
    "average_pool_2d[size 3 stride 1 padding 0, int16x8]": ("lite has no int16x8 kernels"),
    "average_pool_2d[size 3 stride 2 padding 0, int16x8]": ("lite has no int16x8 kernels"),
    "max_pool_2d[size 2 stride 2 padding 1, int16x8]": ("lite has no int16x8 kernels"),
    "max_pool_2d[size 3 stride 1 padding 0, int16x8]": ("lite has no int16x8 kernels"),
    "max_pool_2d[size 3 stride 2 padding 0, int16x8]": ("lite has no int16x8 kernels"),
}
