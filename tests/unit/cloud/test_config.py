"""Bad arguments raise typed errors that name the parameter, at construction time."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud.callbacks import EarlyStopping, LearningRateScheduler, ModelCheckpoint
from sporenet.cloud.errors import ConfigError
from sporenet.cloud.optimizers import SGD, Adam
from sporenet.cloud.schedules import CosineLR, StepLR, WarmUp


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: L.Dense(0, 3), "in_features"),
        (lambda: L.Dense(3, 2.5), "out_features"),
        (lambda: L.Conv2d(3, 4, 0), "kernel_size"),
        (lambda: L.Conv2d(3, 4, 3, stride=(1, 0)), "stride"),
        (lambda: L.Conv2d(3, 4, 3, groups=2), "groups"),
        (lambda: L.Conv2d(3, 4, 3, padding="full"), "padding"),
        (lambda: L.BatchNorm2d(4, momentum=1.5), "momentum"),
        (lambda: L.Dropout(1.0), "p"),
        (lambda: L.GELU(approximate="fast"), "approximate"),
        (lambda: SGD(lr=-1), "lr"),
        (lambda: SGD(nesterov=True), "nesterov"),
        (lambda: Adam(betas=(0.9, 1.0)), "betas[1]"),
        (lambda: StepLR(0.1, step_size=0), "step_size"),
        (lambda: CosineLR(0.1, total_steps=10, min_lr=0.5), "min_lr"),
        (lambda: WarmUp(0.1, warmup_steps=2), "after"),
        (lambda: WarmUp(StepLR(0.1, step_size=1), warmup_steps=0), "warmup_steps"),
        (lambda: EarlyStopping(patience=-1), "patience"),
        (lambda: ModelCheckpoint("x.npz", mode="up"), "mode"),
        (lambda: LearningRateScheduler(0.1), "schedule"),
        (lambda: cloud.set_mode("lazy"), "mode"),
    ],
)
def test_bad_configuration_names_the_parameter(build, name):
    with pytest.raises(ConfigError, match=re.escape(f"`{name}`")):
        build()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": 2, "batch_size": 0}, "batch_size"),
        ({"epochs": 2, "optimizer": "rmsprop"}, "optimizer"),
        ({"epochs": 2, "loss": "hinge"}, "loss"),
        ({"epochs": 2, "mode": "fast"}, "mode"),
        ({"epochs": 2, "verbose": 3}, "verbose"),
        ({"epochs": 2, "initial_epoch": 2}, "initial_epoch"),
        ({"epochs": 2, "validation_data": np.zeros(3)}, "validation_data"),
        ({"epochs": 2, "callbacks": [object()]}, "callbacks[0]"),
    ],
)
def test_fit_rejects_bad_arguments_before_training(kwargs, name):
    model = cloud.Sequential(L.Dense(4, 2))
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    with pytest.raises(ConfigError, match=re.escape(f"`{name}`")):
        cloud.fit(model, x, y, **{"verbose": 0, **kwargs})


def test_module_subclass_must_call_super_init():
    class Broken(cloud.Module):
        def __init__(self):
            self.fc = L.Dense(2, 2)

    with pytest.raises(ConfigError, match="super"):
        Broken()
