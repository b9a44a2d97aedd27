"""Layers: each records its op(s) on the tape of the Var it is called on."""

from sporenet.cloud.layers.activation import (
    GELU,
    HardSwish,
    LeakyReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Tanh,
)
from sporenet.cloud.layers.conv import Conv2d, DepthwiseConv2d
from sporenet.cloud.layers.linear import Dense
from sporenet.cloud.layers.normalization import BatchNorm2d
from sporenet.cloud.layers.pooling import AvgPool2d, GlobalAvgPool, MaxPool2d
from sporenet.cloud.layers.shape import Dropout, Flatten, Rescale

__all__ = [
    "GELU",
    "AvgPool2d",
    "BatchNorm2d",
    "Conv2d",
    "Dense",
    "DepthwiseConv2d",
    "Dropout",
    "Flatten",
    "GlobalAvgPool",
    "HardSwish",
    "LeakyReLU",
    "MaxPool2d",
    "ReLU",
    "ReLU6",
    "Rescale",
    "SiLU",
    "Sigmoid",
    "Tanh",
]
