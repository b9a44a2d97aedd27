"""Training with the IR: a "train" graph (forward, loss, backward, optimizer updates) built
by make_training_model and run by Trainer, on the device or in the cloud."""

from sporenet.lite.training.config import OptimizerConfig
from sporenet.lite.training.model import make_training_model
from sporenet.lite.training.schedules import CosineLR, StepLR, WarmUp
from sporenet.lite.training.trainer import Trainer, inference_model

__all__ = [
    "CosineLR",
    "OptimizerConfig",
    "StepLR",
    "Trainer",
    "WarmUp",
    "inference_model",
    "make_training_model",
]
