"""sporenet: train in the cloud, run and fine-tune on devices, improve across a fleet."""

__version__ = "0.1.0"
