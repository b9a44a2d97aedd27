"""Training with the IR: a "train" graph (forward, loss, backward, optimizer updates) built
by make_training_model and run by Trainer, on the device or in the cloud.

    model = sporenet.lite.load("backbone_and_head.spore")
    train = make_training_model(model, output="logits", loss="softmax_cross_entropy",
                                optimizer=OptimizerConfig("adam", lr=1e-3),
                                trainable={"head.weight", "head.bias"})  # only the head
    trainer = Trainer(train, num_threads=2)
    schedule = WarmUp(CosineLR(1e-3, total_steps=1000), warmup_steps=50)
    for step, (x, y) in enumerate(batches):
        loss = trainer.step({"input": x, "labels": y}, schedule(step))
    sporenet.lite.save(trainer.export(), "fine_tuned.spore")
"""

from sporenet.lite.training.config import OptimizerConfig
from sporenet.lite.training.model import make_training_model
from sporenet.lite.training.schedules import CosineLR, StepLR, WarmUp
from sporenet.lite.training.trainer import Trainer, strip_training

__all__ = [
    "CosineLR",
    "OptimizerConfig",
    "StepLR",
    "Trainer",
    "WarmUp",
    "make_training_model",
    "strip_training",
]
