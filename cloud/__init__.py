"""sporenet.cloud: build models from layers, train them (eager or graph mode), export them.

from sporenet import cloud
from sporenet.cloud import layers as L

model = cloud.Sequential(L.Rescale(1 / 16), L.Flatten(), L.Dense(64, 32), L.ReLU(),
                         L.Dense(32, 10))
cloud.set_mode("graph")
history = cloud.fit(model, x, y, epochs=10, batch_size=32, optimizer=cloud.Adam(lr=1e-2))
cloud.export(model, "digits.spore", labels=[str(d) for d in range(10)])
"""

from sporenet.cloud import engines, layers, losses, mode, models, ops, schedules
from sporenet.cloud.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateScheduler,
    ModelCheckpoint,
    ProgressBar,
)
from sporenet.cloud.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from sporenet.cloud.control_flow import cond, fori_loop, scan, while_loop
from sporenet.cloud.custom_gradient import custom_gradient
from sporenet.cloud.datasets import load_digits, load_fashion_mnist
from sporenet.cloud.errors import (
    CheckpointError,
    CloudError,
    ConfigError,
    DatasetError,
    ExportError,
    TraceError,
)
from sporenet.cloud.export import export, to_inference_ir
from sporenet.cloud.fit import History, evaluate, fit, predict
from sporenet.cloud.init import manual_seed
from sporenet.cloud.mode import get_mode, set_mode, using_mode
from sporenet.cloud.module import Buffer, Module, Parameter, Sequential
from sporenet.cloud.optimizers import SGD, Adam, AdamW, Optimizer
from sporenet.cloud.parallel import DataParallel
from sporenet.cloud.shakespeare import load_shakespeare
from sporenet.cloud.tape import Tape, Var
from sporenet.cloud.trace import trace
from sporenet.cloud.transforms import (
    function,
    functional_call,
    grad,
    hessian,
    jacobian,
    jvp,
    value_and_grad,
    vjp,
)

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Buffer",
    "Callback",
    "CheckpointError",
    "CloudError",
    "ConfigError",
    "DataParallel",
    "DatasetError",
    "EarlyStopping",
    "ExportError",
    "History",
    "LearningRateScheduler",
    "ModelCheckpoint",
    "Module",
    "Optimizer",
    "Parameter",
    "ProgressBar",
    "Sequential",
    "Tape",
    "TraceError",
    "Var",
    "cond",
    "custom_gradient",
    "engines",
    "evaluate",
    "export",
    "fit",
    "fori_loop",
    "function",
    "functional_call",
    "get_mode",
    "grad",
    "hessian",
    "jacobian",
    "jvp",
    "layers",
    "load_checkpoint",
    "load_digits",
    "load_fashion_mnist",
    "load_shakespeare",
    "losses",
    "manual_seed",
    "mode",
    "models",
    "ops",
    "predict",
    "read_checkpoint",
    "save_checkpoint",
    "scan",
    "schedules",
    "set_mode",
    "to_inference_ir",
    "trace",
    "using_mode",
    "value_and_grad",
    "vjp",
    "while_loop",
]
