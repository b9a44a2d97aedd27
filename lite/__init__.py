"""sporenet.lite: the on-device runtime (NumPy and FlatBuffers only).

Load, validate, plan and run .spore model files; build them programmatically.
"""

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.errors import (
    InputError,
    LiteError,
    ModelFormatError,
    ShapeError,
    UnsupportedOpError,
)
from sporenet.lite.format import FILE_EXTENSION, SCHEMA_VERSION, load, parse, save, serialize
from sporenet.lite.graph import Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.ops import OpCode
from sporenet.lite.opset import DECLARATIONS
from sporenet.lite.validate import validate
from sporenet.lite.weights import (
    WeightsReader,
    read_weights,
    replace_weights,
    replace_weights_bytes,
)

# Every op's kernels load with the package, as a runtime's op resolver does, rather than
# inside the first model's load; gradient rules load only when a graph is differentiated.
len(DECLARATIONS)

__all__ = [
    "FILE_EXTENSION",
    "SCHEMA_VERSION",
    "Graph",
    "InputError",
    "Interpreter",
    "LiteError",
    "Model",
    "ModelBuilder",
    "ModelFormatError",
    "Node",
    "OpCode",
    "Quantization",
    "ShapeError",
    "Signature",
    "Tensor",
    "UnsupportedOpError",
    "WeightsReader",
    "load",
    "parse",
    "read_weights",
    "replace_weights",
    "replace_weights_bytes",
    "save",
    "serialize",
    "validate",
]
